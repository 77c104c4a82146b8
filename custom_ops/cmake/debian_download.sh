#!/bin/sh
# Download Debian packages of any suite and architecture through the apt mirror this system is already
# configured with, without installing or changing anything on the system
# (usage: debian_download.sh SUITE ARCH DEST PACKAGE...; SUITE "system" is this system's release).
#
# The Debian entries of /etc/apt/sources.list{,.d} whose suite is this system's release are rewritten to
# SUITE in a private sources file, and apt runs on private lists, cache, status and configuration, so no
# host name is written anywhere in the repository. The .deb files land in DEST.
set -eu

suite=$1
arch=$2
dest=$3
shift 3

. /etc/os-release
codename=${VERSION_CODENAME:?"no VERSION_CODENAME in /etc/os-release"}
[ "$suite" = system ] && suite=$codename

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
chmod 755 "$work"  # apt's unprivileged download user must reach its partial/ folders
mkdir -p "$work/sources.list.d" "$work/lists/partial" "$work/cache/archives/partial" "$dest"
: > "$work/status"

# One-line format: "deb [options] URI SUITE COMPONENT...".
for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -f "$f" ] || continue
    awk -v codename="$codename" -v suite="$suite" '
        $1 == "deb" {
            i = 2; options = ""
            if ($2 ~ /^\[/) { while (i <= NF) { options = options " " $i; if ($i ~ /\]$/) break; i++ } i++ }
            if ($(i + 1) == codename) print "deb" options " " $i " " suite " main"
        }' "$f"
done > "$work/sources.list.d/derived.list"

# deb822 format: blank-line separated stanzas of "Field: value" lines.
for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    awk -v codename="$codename" -v suite="$suite" '
        BEGIN { RS = ""; FS = "\n" }
        {
            types = uris = suites = signed = enabled = key = ""
            for (i = 1; i <= NF; i++) {
                line = $i
                if (line ~ /^#/) continue
                if (line ~ /^[ \t]/) {  # continuation line, e.g. of an inline Signed-By key
                    if (key == "signed-by") signed = signed "\n" line
                    continue
                }
                key = tolower(substr(line, 1, index(line, ":") - 1))
                value = substr(line, index(line, ":") + 1)
                if (key == "types") types = value
                else if (key == "uris") uris = value
                else if (key == "suites") suites = value
                else if (key == "signed-by") signed = line
                else if (key == "enabled") enabled = value
            }
            if (enabled ~ /no/ || (" " types " ") !~ /[ \t]deb[ \t]/ || (" " suites " ") !~ ("[ \t]" codename "[ \t]")) next
            print "Types: deb\nURIs:" uris "\nSuites: " suite "\nComponents: main"
            if (signed != "") print signed
            print ""
        }' "$f"
done > "$work/sources.list.d/derived.sources"

if [ ! -s "$work/sources.list.d/derived.list" ] && [ ! -s "$work/sources.list.d/derived.sources" ]; then
    echo "no Debian '$codename' entry in the apt sources to derive a '$suite' source from" >&2
    exit 1
fi

# A private configuration read after the system's (which keeps its proxy settings): private state,
# no lock on the system's, and none of the system's update hooks.
cat > "$work/apt.conf" <<CONF
APT::Architecture "$arch";
APT::Architectures { "$arch"; };
Dir::Etc::SourceList "/dev/null";
Dir::Etc::SourceParts "$work/sources.list.d";
Dir::State::Lists "$work/lists";
Dir::State::status "$work/status";
Dir::Cache "$work/cache";
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
Debug::NoLocking "true";
Acquire::Languages "none";
#clear APT::Update::Pre-Invoke;
#clear APT::Update::Post-Invoke;
#clear APT::Update::Post-Invoke-Success;
CONF

# A derived entry whose host has no such suite (a third-party repository on the same suite name) fails
# the update without harming the others; the download below is the real test.
apt-get -c "$work/apt.conf" -qq update || echo "apt-get update reported errors; trying the download anyway" >&2
mkdir -p "$work/deb"
chown _apt "$work/deb" 2>/dev/null || true  # apt downloads as its own user where it may write the folder
(cd "$work/deb" && apt-get -c "$work/apt.conf" -qq download "$@")
mv "$work"/deb/*.deb "$dest/"
