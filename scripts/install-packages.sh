# Sourced: install_missing_packages PKG... installs, with apt-get, those of
# the Debian packages given that are not installed yet (sudo when not root).
install_missing_packages() {
  local missing=() p sudo=""
  for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  ((${#missing[@]})) || return 0
  echo "installing ${missing[*]}"
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}
