# meshtrain_builtin_hardware(OUT): writes OUT (a .inc file) holding the
# built-in hardware profiles, configs/hardware/<name>.toml for each name of
# MESHTRAIN_BUILTIN_HARDWARE, as C++ raw string literals (sched/hardware.cpp
# includes it). Used by the main build and by fuzz/.
set(MESHTRAIN_BUILTIN_HARDWARE h100-sxm h200 cpu-2core)
function(meshtrain_builtin_hardware out)
  set(text "")
  foreach(profile ${MESHTRAIN_BUILTIN_HARDWARE})
    set(profile_file ${CMAKE_CURRENT_FUNCTION_LIST_DIR}/../configs/hardware/${profile}.toml)
    set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${profile_file})
    file(READ ${profile_file} profile_text)
    string(APPEND text "R\"toml(${profile_text})toml\",\n")
  endforeach()
  file(CONFIGURE OUTPUT ${out} CONTENT "${text}" @ONLY)
endfunction()
