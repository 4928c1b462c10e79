#!/usr/bin/env bash
# The example commands of README.md work: every line of the ```sh blocks
# under its "## Examples" heading (lines starting with # are comments) is
# run, in order, and must exit 0; a failure prints the command and its
# output. The two set-up commands at the top of the README (scripts/run.sh,
# scripts/test.sh) are not run here: they install packages and build, and
# they are what CI itself runs.
# The commands run as a user types them in the repository root, but in a
# scratch folder made to look like one (configs/, data/ and scripts/ linked
# from the source, build/meshtrain the binary under test, scripts/mpirun.sh
# the MPIRUN command given), so whatever they write (runs/, checkpoints,
# exports) lands there and is removed afterwards; a second run starts afresh.
# Usage: readme_commands_test.sh "MPIRUN [FLAGS]" MESHTRAIN SOURCE_DIR
set -u
mpirun=$1 meshtrain=$2 src=$3
fail() { echo "FAIL: $*"; exit 1; }
[ -x "$meshtrain" ] || fail "no meshtrain binary at $meshtrain"
[ -f "$src/README.md" ] || fail "no README.md in $src"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

# The commands: the ```sh blocks between "## Examples" and the next "## " heading.
mapfile -t commands < <(awk '
  /^## / { in_examples = ($0 ~ /^## Examples[[:space:]]*$/); next }
  in_examples && /^```sh[[:space:]]*$/ { in_block = 1; next }
  in_block && /^```/ { in_block = 0; next }
  in_block && !/^[[:space:]]*(#|$)/ { print }
' "$src/README.md")
[ "${#commands[@]}" -ge 5 ] || fail "found ${#commands[@]} example commands in README.md's ## Examples (expected 5 or more)"

root=$dir/repo
mkdir -p "$root/build" "$root/scripts"
ln -s "$src/configs" "$root/configs"
ln -s "$src/data" "$root/data"
ln -s "$(realpath "$meshtrain")" "$root/build/meshtrain"
for script in "$src"/scripts/*; do ln -s "$script" "$root/scripts/$(basename "$script")"; done
rm "$root/scripts/mpirun.sh"
printf '#!/usr/bin/env bash\nexec %s "$@"\n' "$mpirun" > "$root/scripts/mpirun.sh"
chmod +x "$root/scripts/mpirun.sh"

cd "$root" || fail "cannot enter $root"
start=$(date +%s)
for i in "${!commands[@]}"; do
  cmd=${commands[$i]}
  case "$cmd" in
    scripts/run.sh* | scripts/test.sh*) echo "skip (set-up, run by CI): $cmd"; continue ;;
  esac
  t0=$(date +%s%N)
  out=$(timeout 120 bash -c "$cmd" 2>&1)
  rc=$?
  ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  if [ $rc -ne 0 ]; then
    echo "$out"
    fail "README example $((i + 1)) exited $rc after $ms ms: $cmd"
  fi
  echo "ok ($ms ms): $cmd"
done
echo "PASS: ${#commands[@]} README examples in $(( $(date +%s) - start )) s"
