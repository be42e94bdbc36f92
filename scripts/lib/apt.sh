# Sourced by the ensure-* scripts: a private apt configuration for one Debian suite, so the
# system's own sources, lists and caches stay untouched. The mirror is the one this machine
# already uses.
#
#   private_apt SUITE      sets apt_work (the suite's directory under $cache) and apt_opts,
#                          and runs `apt-get update` for that suite once per call
#   apt_get ARGS...        apt-get with those options
#   apt_cache ARGS...      apt-cache with those options

private_apt() {
  local suite="$1" mirror
  command -v apt-get >/dev/null || { echo "no apt-get on this machine: install the servers by hand (see docs/src/howto/test.md)" >&2; return 1; }
  mirror=$(sed -n 's/^URIs:[[:space:]]*//p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | grep -v security | head -n1)
  [ -n "$mirror" ] || mirror=$(awk '/^deb /{print $2; exit}' /etc/apt/sources.list 2>/dev/null)
  [ -n "$mirror" ] || { echo "cannot find a Debian mirror in the apt configuration" >&2; return 1; }
  apt_work="$cache/apt-$suite"
  mkdir -p "$apt_work/lists/partial" "$apt_work/cache/archives/partial" "$apt_work/etc" "$apt_work/pkg"
  echo "deb [trusted=yes] $mirror $suite main" > "$apt_work/etc/sources.list"
  apt_opts=(-o "Dir::Etc::SourceList=$apt_work/etc/sources.list" -o "Dir::Etc::SourceParts=/dev/null"
            -o "Dir::State::Lists=$apt_work/lists" -o "Dir::Cache=$apt_work/cache"
            -o "APT::Get::List-Cleanup=0" -o "Debug::NoLocking=1" -o "APT::Sandbox::User=root")
  echo "reading Debian $suite's package lists ($mirror)" >&2
  apt-get "${apt_opts[@]}" -q update >&2
}

apt_get() { apt-get "${apt_opts[@]}" "$@"; }
apt_cache() { apt-cache "${apt_opts[@]}" "$@"; }
