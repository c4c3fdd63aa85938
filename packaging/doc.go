// Package packaging builds and checks the Debian package and systemd units.
//
// It holds no Go code to import: build-deb.sh builds
// ticketing_<version>_<arch>.deb (make deb), and packaging_test.go checks
// the units with systemd-analyze, the package with dpkg-deb, the example
// configuration against the binary's flags, and the maintainer scripts
// against a scratch root with stubbed system commands. README.md describes
// the package.
package packaging
