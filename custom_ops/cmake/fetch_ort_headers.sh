#!/bin/sh
# Obtain the onnxruntime C/C++ API headers from Debian's libonnxruntime-dev (suite trixie) and copy
# them to DEST (usage: fetch_ort_headers.sh DEST). The package is fetched through the apt mirror this
# system is already configured with (debian_download.sh): nothing is installed or changed on the system.
set -eu

dest=$1
package=libonnxruntime-dev

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
sh "$(dirname "$0")/debian_download.sh" trixie "$(dpkg --print-architecture)" "$work/deb" "$package"
dpkg-deb -x "$work"/deb/"$package"_*.deb "$work/root"

headers="$work/root/usr/include/onnxruntime"
[ -f "$headers/onnxruntime_cxx_api.h" ] || { echo "$package has no onnxruntime_cxx_api.h" >&2; exit 1; }
mkdir -p "$(dirname "$dest")"
rm -rf "$dest.tmp"
cp -R "$headers" "$dest.tmp"
rm -rf "$dest"
mv "$dest.tmp" "$dest"
echo "onnxruntime headers from $(basename "$work"/deb/"$package"_*.deb) in $dest"
