#!/bin/sh
# build-deb.sh [OUTDIR]: build ticketing_<version>_<arch>.deb into OUTDIR
# (default: dist/ at the top of the repository) with dpkg-deb, from a fresh
# staging tree. Only builds: needs go and dpkg-deb, not root, and changes
# nothing outside OUTDIR (running it again replaces the .deb).
#
# Environment:
#   VERSION  package version (default: from the newest version tag, v1.2.3
#            or 1.2.3, that `git describe --tags` finds: on it -> 1.2.3,
#            3 commits past it -> 1.2.3+git3.<hash>; no version tag ->
#            0.0.0+git<hash>; no git -> 0.0.0)
#   ARCH     Debian architecture (default: `dpkg --print-architecture`);
#            the binary is cross-built for it (amd64, arm64, armhf, i386,
#            ppc64el, riscv64, s390x)
#   GO       go command (default: go)
#   MAINTAINER  the control file's Maintainer field
# Prints the path of the .deb on the last line of stdout.
# build-deb.sh --print-version prints the version it would use and exits.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/.." && pwd)
outdir=${1:-$top/dist}
GO=${GO:-go}
MAINTAINER=${MAINTAINER:-Ticketing maintainers <ticketing@localhost>}

# Version: Debian versions must start with a digit. Only a real version
# tag (v1.2.3 or 1.2.3) counts as one: the describe output alone cannot
# tell a tag from an abbreviated hash that happens to start with a digit.
if [ -z "${VERSION:-}" ]; then
	if desc=$(git -C "$top" describe --tags --long --match 'v[0-9]*' --match '[0-9]*' 2>/dev/null); then
		# v1.2.3-4-gabcdef0: the tag, commits past it, the hash.
		tag=$(printf '%s\n' "$desc" | sed -E 's/-[0-9]+-g[0-9a-f]+$//')
		past=$(printf '%s\n' "$desc" | sed -E 's/^.*-([0-9]+)-g[0-9a-f]+$/\1/')
		hash=$(printf '%s\n' "$desc" | sed -E 's/^.*-g([0-9a-f]+)$/\1/')
		tag=${tag#v}
		if [ "$past" = 0 ]; then VERSION=$tag; else VERSION=$tag+git$past.$hash; fi
	elif hash=$(git -C "$top" rev-parse --short HEAD 2>/dev/null) && [ -n "$hash" ]; then
		VERSION=0.0.0+git$hash
	else
		VERSION=0.0.0
	fi
fi
VERSION=${VERSION#v}
case $VERSION in
[0-9]*) ;;
*) echo "build-deb.sh: version $VERSION does not start with a digit" >&2; exit 1 ;;
esac
if [ "${1:-}" = --print-version ]; then
	echo "$VERSION"
	exit 0
fi
for tool in dpkg-deb "$GO"; do
	command -v "$tool" >/dev/null 2>&1 || { echo "build-deb.sh: $tool not found" >&2; exit 1; }
done

ARCH=${ARCH:-$(dpkg --print-architecture 2>/dev/null || echo amd64)}
case $ARCH in
amd64) goarch=amd64 ;; arm64) goarch=arm64 ;; armhf) goarch=arm goarm=7 ;;
i386) goarch=386 ;; ppc64el) goarch=ppc64le ;; riscv64) goarch=riscv64 ;;
s390x) goarch=s390x ;;
*) echo "build-deb.sh: no Go architecture known for $ARCH" >&2; exit 1 ;;
esac

# File times in the package: the commit's (dpkg-deb clamps to it).
if [ -z "${SOURCE_DATE_EPOCH:-}" ]; then
	SOURCE_DATE_EPOCH=$(git -C "$top" log -1 --format=%ct 2>/dev/null || date +%s)
fi
export SOURCE_DATE_EPOCH

stage=$(mktemp -d "${TMPDIR:-/tmp}/ticketing-deb.XXXXXX")
trap 'rm -rf "$stage"' EXIT INT TERM
root=$stage/root
umask 022

# The binary: static (the project has no cgo), reproducible paths, and
# the package version and commit for `ticketing --version`
# (cmd/internal/cli/version.go).
commit=$(git -C "$top" rev-parse HEAD 2>/dev/null || true)
mkdir -p "$root/usr/bin"
(cd "$top" && CGO_ENABLED=0 GOOS=linux GOARCH=$goarch GOARM=${goarm:-} \
	"$GO" build -trimpath \
	-ldflags="-s -w -X ticketing/cmd/internal/cli.Version=$VERSION -X ticketing/cmd/internal/cli.Commit=$commit" \
	-o "$root/usr/bin/ticketing" ./cmd/ticketing)
chmod 0755 "$root/usr/bin/ticketing"

install -d -m 0755 "$root/lib/systemd/system"
install -m 0644 "$here/systemd/ticketing-node.service" "$here/systemd/ticketing-sidecar.service" \
	"$here/systemd/ticketing-sidecar.socket" "$root/lib/systemd/system/"

# /etc/ticketing: 0750 (group ticketing is set by postinst through
# dpkg-statoverride: the group does not exist at build time). The two
# example files hold no secret.
install -d -m 0750 "$root/etc/ticketing"
install -m 0644 "$here/etc/node.conf" "$here/etc/sidecar.conf" "$root/etc/ticketing/"

doc=$root/usr/share/doc/ticketing
install -d -m 0755 "$doc"
install -m 0644 "$top/README.md" "$doc/README.md"
# The README's documents (its links point into docs/).
install -d -m 0755 "$doc/docs"
install -m 0644 "$top"/docs/*.md "$doc/docs/"
# Their images (docs/operations.md's console screenshot).
install -d -m 0755 "$doc/docs/images"
install -m 0644 "$top"/docs/images/*.png "$doc/docs/images/"
# The local API and the client contract, which the README and docs link to
# (same relative paths as in the repository, so the links hold).
install -d -m 0755 "$doc/unixapi" "$doc/clients"
install -m 0644 "$top/unixapi/PROTOCOL.md" "$doc/unixapi/PROTOCOL.md"
install -m 0644 "$top/clients/README.md" "$top/clients/FENCING.md" "$doc/clients/"
install -m 0644 "$here/README.md" "$doc/README.Debian"
install -m 0644 "$here/debian/copyright" "$doc/copyright"

install -d -m 0755 "$root/DEBIAN"
for s in postinst prerm postrm; do
	install -m 0755 "$here/debian/$s" "$root/DEBIAN/$s"
done
printf '%s\n' /etc/ticketing/node.conf /etc/ticketing/sidecar.conf >"$root/DEBIAN/conffiles"
chmod 0644 "$root/DEBIAN/conffiles"

size=$(du -sk --exclude=DEBIAN "$root" | cut -f1)
cat >"$root/DEBIAN/control" <<CONTROL
Package: ticketing
Version: $VERSION
Architecture: $ARCH
Maintainer: $MAINTAINER
Installed-Size: $size
Depends: adduser
Section: net
Priority: optional
Description: replicated lock service with fencing tokens
 Ticketing is a Raft-replicated lock service: named locks with leases,
 queued waiters and fencing tokens. One binary, /usr/bin/ticketing, runs
 a cluster node (ticketing-node.service), the sidecar that local programs
 reach over a unix socket (ticketing-sidecar.socket and .service) and the
 tools: bootstrap, members, status, inspect, certs.
 .
 Nothing is started on install: configure /etc/ticketing first
 (/usr/share/doc/ticketing/README.Debian).
CONTROL
chmod 0644 "$root/DEBIAN/control"

mkdir -p "$outdir"
deb=$outdir/ticketing_${VERSION}_${ARCH}.deb
rm -f "$deb"
dpkg-deb --root-owner-group -Zxz --build "$root" "$deb" >/dev/null
echo "$deb"
