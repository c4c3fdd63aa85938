package packaging

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// The package is built once per test binary and shared by the tests.
var (
	buildOnce sync.Once
	built     struct {
		deb     string // the .deb
		root    string // its data tree, extracted
		control string // its control area, extracted
		err     error
	}
)

const units = "ticketing-node.service ticketing-sidecar.service ticketing-sidecar.socket"

func need(t *testing.T, tools ...string) {
	t.Helper()
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not found: install Debian's %s package to run this test", tool,
				map[string]string{"dpkg-deb": "dpkg", "systemd-analyze": "systemd", "go": "golang"}[tool])
		}
	}
}

func run(t *testing.T, env []string, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out.String())
	}
	return out.String()
}

// deb builds the package into a directory that outlives the tests that
// share it (removed by TestMain).
func deb(t *testing.T) (debPath, root, control string) {
	t.Helper()
	need(t, "dpkg-deb", "go")
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "ticketing-packaging-test")
		if err != nil {
			built.err = err
			return
		}
		tmpDirs = append(tmpDirs, dir)
		start := time.Now()
		cmd := exec.Command("./build-deb.sh", filepath.Join(dir, "out"))
		cmd.Env = append(os.Environ(), "VERSION=1.2.3+test")
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			built.err = fmt.Errorf("build-deb.sh: %v\n%s%s", err, out, stderr.String())
			return
		}
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		built.deb = lines[len(lines)-1]
		built.root = filepath.Join(dir, "root")
		built.control = filepath.Join(dir, "control")
		for _, args := range [][]string{{"-x", built.deb, built.root}, {"-e", built.deb, built.control}} {
			if out, err := exec.Command("dpkg-deb", args...).CombinedOutput(); err != nil {
				built.err = fmt.Errorf("dpkg-deb %v: %v\n%s", args, err, out)
				return
			}
		}
		fmt.Fprintf(os.Stderr, "packaging: built %s in %v\n", filepath.Base(built.deb), time.Since(start).Round(time.Millisecond))
	})
	if built.err != nil {
		t.Fatal(built.err)
	}
	return built.deb, built.root, built.control
}

var tmpDirs []string

func TestMain(m *testing.M) {
	code := m.Run()
	for _, d := range tmpDirs {
		os.RemoveAll(d)
	}
	os.Exit(code)
}

// unitKeys reads a unit file's Key=Value lines (every value of a key).
func unitKeys(t *testing.T, path string) map[string][]string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	keys := map[string][]string{}
	for line := range strings.Lines(string(b)) {
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' || line[0] == '[' {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			t.Errorf("%s: line %q is not Key=Value", path, line)
			continue
		}
		keys[k] = append(keys[k], v)
	}
	return keys
}

// TestUnits checks the contract's settings in the three units, then
// verifies them with systemd-analyze (ExecStart pointed at the packaged
// binary, which verify needs to exist): no output is allowed, so a
// misspelt key or a bad value fails the test.
func TestUnits(t *testing.T) {
	need(t, "systemd-analyze")
	_, root, _ := deb(t)

	want := map[string]map[string]string{
		"ticketing-node.service": {
			"ExecStart": "/usr/bin/ticketing node --config /etc/ticketing/node.conf",
			"Type":      "notify", "NotifyAccess": "main", "WatchdogSec": "30s",
			"StateDirectory": "ticketing",
		},
		"ticketing-sidecar.service": {
			"ExecStart": "/usr/bin/ticketing sidecar --config /etc/ticketing/sidecar.conf",
			"Type":      "notify", "WatchdogSec": "30s", "NotifyAccess": "main",
			"Requires": "ticketing-sidecar.socket",
		},
		"ticketing-sidecar.socket": {
			"ListenStream": "/run/ticketing/ticketing.sock",
			"SocketUser":   "ticketing", "SocketGroup": "ticketing", "SocketMode": "0660",
		},
	}
	hardening := map[string]string{
		"User": "ticketing", "Group": "ticketing", "ConfigurationDirectory": "ticketing",
		"NoNewPrivileges": "yes", "ProtectSystem": "strict", "ProtectHome": "yes",
		"PrivateTmp": "yes", "PrivateDevices": "yes", "ProtectKernelTunables": "yes",
		"ProtectKernelModules": "yes", "ProtectKernelLogs": "yes", "ProtectControlGroups": "yes",
		"RestrictAddressFamilies": "AF_UNIX AF_INET AF_INET6", "RestrictNamespaces": "yes",
		"LockPersonality": "yes", "MemoryDenyWriteExecute": "yes",
		"SystemCallArchitectures": "native", "CapabilityBoundingSet": "", "AmbientCapabilities": "",
		"LimitNOFILE": "65536", "Restart": "on-failure", "RestartSec": "2s",
		"TimeoutStopSec": "15s", "KillMode": "mixed", "TimeoutStartSec": "infinity",
	}
	dir := t.TempDir()
	var verify []string
	for _, name := range strings.Fields(units) {
		src := filepath.Join(root, "lib/systemd/system", name)
		keys := unitKeys(t, src)
		w := want[name]
		if strings.HasSuffix(name, ".service") {
			for k, v := range hardening {
				w[k] = v
			}
		}
		for k, v := range w {
			if !slices.Contains(keys[k], v) {
				t.Errorf("%s: %s=%q, want %s=%s", name, k, keys[k], k, v)
			}
		}
		if name == "ticketing-sidecar.service" {
			if !slices.Contains(keys["After"], "ticketing-sidecar.socket") {
				t.Errorf("%s: not After= the socket", name)
			}
			// /run/ticketing belongs to the socket unit: a RuntimeDirectory
			// would be deleted, socket and all, when the sidecar stops.
			if len(keys["RuntimeDirectory"]) > 0 {
				t.Errorf("%s: RuntimeDirectory=%v would remove the socket's directory", name, keys["RuntimeDirectory"])
			}
		}
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		b = bytes.ReplaceAll(b, []byte("ExecStart=/usr/bin/ticketing "),
			[]byte("ExecStart="+filepath.Join(root, "usr/bin/ticketing")+" "))
		dst := filepath.Join(dir, name)
		if err := os.WriteFile(dst, b, 0o644); err != nil {
			t.Fatal(err)
		}
		verify = append(verify, dst)
	}

	out, err := exec.Command("systemd-analyze", append([]string{"verify"}, verify...)...).CombinedOutput()
	if err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}

	// Exposure as systemd-analyze scores it (0 = locked down, 10 = none);
	// both services score 1.8 today.
	for _, name := range []string{"ticketing-node.service", "ticketing-sidecar.service"} {
		out, err := exec.Command("systemd-analyze", "security", "--offline=yes", "--threshold=25",
			"--no-pager", filepath.Join(dir, name)).CombinedOutput()
		if err != nil {
			t.Errorf("systemd-analyze security %s: exposure above 2.5 (%v):\n%s", name, err, out)
		} else if m := regexp.MustCompile(`Overall exposure level for \S+: [0-9.]+`).Find(out); m != nil {
			t.Logf("%s", m)
		}
	}
}

// TestPackage checks the .deb: control fields, conffiles, file list,
// owners and modes, and that the files are the ones in packaging/.
func TestPackage(t *testing.T) {
	debPath, root, control := deb(t)

	if got, want := filepath.Base(debPath), "ticketing_1.2.3+test_"; !strings.HasPrefix(got, want) || !strings.HasSuffix(got, ".deb") {
		t.Errorf("package file %s, want %s<arch>.deb", got, want)
	}
	fields := map[string]string{}
	for _, f := range []string{"Package", "Version", "Architecture", "Maintainer", "Depends", "Description", "Installed-Size"} {
		fields[f] = strings.TrimSpace(run(t, nil, "dpkg-deb", "-f", debPath, f))
		if fields[f] == "" {
			t.Errorf("control: no %s field", f)
		}
	}
	if fields["Package"] != "ticketing" || fields["Version"] != "1.2.3+test" {
		t.Errorf("control: Package %q Version %q", fields["Package"], fields["Version"])
	}
	if arch := strings.TrimSpace(run(t, nil, "dpkg", "--print-architecture")); fields["Architecture"] != arch {
		t.Errorf("control: Architecture %q, want %q", fields["Architecture"], arch)
	}
	if !strings.Contains(fields["Depends"], "adduser") {
		t.Errorf("control: Depends %q lacks adduser (postinst uses it)", fields["Depends"])
	}
	info := run(t, nil, "dpkg-deb", "-I", debPath)
	for _, s := range []string{"conffiles", "postinst", "prerm", "postrm"} {
		if !strings.Contains(info, s) {
			t.Errorf("dpkg-deb -I shows no %s:\n%s", s, info)
		}
	}

	conffiles, err := os.ReadFile(filepath.Join(control, "conffiles"))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Fields(string(conffiles)), []string{"/etc/ticketing/node.conf", "/etc/ticketing/sidecar.conf"}; !slices.Equal(got, want) {
		t.Errorf("conffiles %v, want %v", got, want)
	}
	for _, s := range []string{"postinst", "prerm", "postrm"} {
		if fi, err := os.Stat(filepath.Join(control, s)); err != nil || fi.Mode().Perm() != 0o755 {
			t.Errorf("DEBIAN/%s: %v %v, want mode 0755", s, fi.Mode(), err)
		}
	}

	// dpkg-deb -c: "drwxr-x--- root/root 0 2026-01-01 00:00 ./etc/ticketing/"
	listing := map[string][2]string{} // path -> mode, owner
	sc := bufio.NewScanner(strings.NewReader(run(t, nil, "dpkg-deb", "-c", debPath)))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 6 {
			continue
		}
		listing[strings.TrimSuffix(strings.TrimPrefix(f[5], "."), "/")] = [2]string{f[0], f[1]}
	}
	wantFiles := map[string]string{
		"/usr/bin/ticketing":                            "-rwxr-xr-x",
		"/lib/systemd/system/ticketing-node.service":    "-rw-r--r--",
		"/lib/systemd/system/ticketing-sidecar.service": "-rw-r--r--",
		"/lib/systemd/system/ticketing-sidecar.socket":  "-rw-r--r--",
		"/etc/ticketing":                                "drwxr-x---",
		"/etc/ticketing/node.conf":                      "-rw-r--r--",
		"/etc/ticketing/sidecar.conf":                   "-rw-r--r--",
		"/usr/share/doc/ticketing/README.md":            "-rw-r--r--",
		"/usr/share/doc/ticketing/docs/operations.md":   "-rw-r--r--",
		"/usr/share/doc/ticketing/docs/security.md":     "-rw-r--r--",
		"/usr/share/doc/ticketing/docs/performance.md":  "-rw-r--r--",
		"/usr/share/doc/ticketing/docs/verification.md": "-rw-r--r--",
		"/usr/share/doc/ticketing/README.Debian":        "-rw-r--r--",
		"/usr/share/doc/ticketing/unixapi/PROTOCOL.md":  "-rw-r--r--",
		"/usr/share/doc/ticketing/clients/README.md":    "-rw-r--r--",
		"/usr/share/doc/ticketing/clients/FENCING.md":   "-rw-r--r--",
		"/usr/share/doc/ticketing/copyright":            "-rw-r--r--",
	}
	for p, mode := range wantFiles {
		got, ok := listing[p]
		if !ok {
			t.Errorf("package lacks %s", p)
			continue
		}
		if got[0] != mode {
			t.Errorf("%s: mode %s, want %s", p, got[0], mode)
		}
	}
	for p, got := range listing {
		if got[1] != "root/root" {
			t.Errorf("%s: owner %s, want root/root", p, got[1])
		}
		if strings.HasPrefix(p, "/var/lib/ticketing") {
			t.Errorf("%s: the data directory is not the package's (purge must never touch it)", p)
		}
	}

	// The shipped files are the ones in packaging/.
	for src, dst := range map[string]string{
		"systemd/ticketing-node.service":    "lib/systemd/system/ticketing-node.service",
		"systemd/ticketing-sidecar.service": "lib/systemd/system/ticketing-sidecar.service",
		"systemd/ticketing-sidecar.socket":  "lib/systemd/system/ticketing-sidecar.socket",
		"etc/node.conf":                     "etc/ticketing/node.conf",
		"etc/sidecar.conf":                  "etc/ticketing/sidecar.conf",
		"README.md":                         "usr/share/doc/ticketing/README.Debian",
		"debian/copyright":                  "usr/share/doc/ticketing/copyright",
		"debian/postinst":                   "",
	} {
		if dst == "" {
			dst = filepath.Join(control, "postinst")
		} else {
			dst = filepath.Join(root, dst)
		}
		a, err1 := os.ReadFile(src)
		b, err2 := os.ReadFile(dst)
		if err1 != nil || err2 != nil || !bytes.Equal(a, b) {
			t.Errorf("%s differs from packaging/%s (%v, %v)", dst, src, err1, err2)
		}
	}

	// The documents are the repository's, at the same relative paths, and
	// their links to each other hold in the package: every relative link
	// of a shipped document resolves there, except to the sources and to
	// documents only the repository has (sourceOnly).
	doc := filepath.Join(root, "usr/share/doc/ticketing")
	shipped := []string{"README.md", "unixapi/PROTOCOL.md", "clients/README.md", "clients/FENCING.md"}
	mds, _ := filepath.Glob(filepath.Join("..", "docs", "*.md"))
	for _, m := range mds {
		shipped = append(shipped, "docs/"+filepath.Base(m))
	}
	sourceOnly := []string{".ci/", "cluster/", "locksm/", "cmd/", "packaging/", "clients/go", "clients/python",
		"clients/node", "clients/examples", "clients/conformance", "clients/schema", "sidecar/"}
	link := regexp.MustCompile(`\]\(([^)\s#]+)(#[^)\s]*)?\)`)
	linked := map[string]bool{}
	for _, f := range shipped {
		a, err1 := os.ReadFile(filepath.Join("..", f))
		b, err2 := os.ReadFile(filepath.Join(doc, f))
		if err1 != nil || err2 != nil || !bytes.Equal(a, b) {
			t.Errorf("%s in the package differs from the repository's (%v, %v)", f, err1, err2)
			continue
		}
		for _, m := range link.FindAllStringSubmatch(string(b), -1) {
			if strings.Contains(m[1], "://") || strings.HasPrefix(m[1], "mailto:") {
				continue
			}
			target := filepath.ToSlash(filepath.Join(filepath.Dir(f), m[1]))
			if slices.ContainsFunc(sourceOnly, func(p string) bool { return strings.HasPrefix(target, p) }) {
				continue
			}
			linked[target] = true
			if _, err := os.Stat(filepath.Join(doc, target)); err != nil {
				t.Errorf("%s links to %s, which the package lacks", f, m[1])
			}
		}
	}
	for _, want := range []string{"unixapi/PROTOCOL.md", "clients/README.md"} {
		if !linked[want] {
			t.Errorf("no shipped document links to %s any more: keep shipping it?", want)
		}
	}

	// A static binary that runs.
	out, _ := exec.Command(filepath.Join(root, "usr/bin/ticketing"), "node", "--help").CombinedOutput()
	if !strings.Contains(string(out), "-data-dir") {
		t.Errorf("packaged ticketing node --help:\n%s", out)
	}
	// It knows the package's version (build-deb.sh sets it).
	out, err = exec.Command(filepath.Join(root, "usr/bin/ticketing"), "--version").CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), "ticketing 1.2.3+test, commit ") {
		t.Errorf("packaged ticketing --version: %v\n%s", err, out)
	}
}

// flags lists the long flags a subcommand's --help prints.
func flags(t *testing.T, bin, sub string) []string {
	t.Helper()
	out, _ := exec.Command(bin, sub, "--help").CombinedOutput()
	var names []string
	for _, m := range regexp.MustCompile(`(?m)^  -([a-z0-9-]+)`).FindAllStringSubmatch(string(out), -1) {
		names = append(names, m[1])
	}
	if len(names) < 5 {
		t.Fatalf("%s %s --help lists %d flags:\n%s", bin, sub, len(names), out)
	}
	return names
}

// TestConfigExamples checks node.conf and sidecar.conf against the flags of
// the binary they are for: every setting named (set or commented out) is a
// real flag, every flag is documented, nothing is set twice, the paths
// match the units.
func TestConfigExamples(t *testing.T) {
	_, root, _ := deb(t)
	bin := filepath.Join(root, "usr/bin/ticketing")
	setting := regexp.MustCompile(`^#?([a-z0-9-]+) = (.*)$`)
	// Not in the examples on purpose: the file itself.
	skip := []string{"config"}
	for _, c := range []struct{ file, sub string }{{"etc/node.conf", "node"}, {"etc/sidecar.conf", "sidecar"}} {
		real := flags(t, bin, c.sub)
		b, err := os.ReadFile(c.file)
		if err != nil {
			t.Fatal(err)
		}
		set := map[string]string{}
		named := map[string]bool{}
		for line := range strings.Lines(string(b)) {
			m := setting.FindStringSubmatch(strings.TrimRight(line, "\n"))
			if m == nil {
				continue
			}
			name, value := m[1], m[2]
			if !slices.Contains(real, name) {
				t.Errorf("%s: %q is not a flag of ticketing %s", c.file, name, c.sub)
			}
			named[name] = true
			if !strings.HasPrefix(line, "#") {
				if _, dup := set[name]; dup {
					t.Errorf("%s: %s set twice", c.file, name)
				}
				set[name] = strings.Trim(value, `"`)
			}
		}
		for _, f := range real {
			if !named[f] && !slices.Contains(skip, f) {
				t.Errorf("%s: flag --%s of ticketing %s is not documented", c.file, f, c.sub)
			}
		}
		for name, value := range set {
			if strings.HasPrefix(value, "/") && name != "data-dir" && name != "socket" && !strings.HasPrefix(value, "/etc/ticketing/") {
				t.Errorf("%s: %s = %s is outside /etc/ticketing", c.file, name, value)
			}
		}
		switch c.sub {
		case "node":
			if set["data-dir"] != "/var/lib/ticketing" {
				t.Errorf("%s: data-dir = %q, want the unit's StateDirectory /var/lib/ticketing", c.file, set["data-dir"])
			}
		case "sidecar":
			if set["socket"] != "/run/ticketing/ticketing.sock" {
				t.Errorf("%s: socket = %q, want the socket unit's ListenStream", c.file, set["socket"])
			}
		}
		// The binary reads the file (once it has --config): with a
		// secret file that cannot exist, it must get as far as that.
		if slices.Contains(real, "config") {
			subs := []string{c.sub}
			if c.sub == "node" {
				subs = append(subs, "bootstrap")
			}
			for _, sub := range subs {
				cmd := exec.Command(bin, sub, "--config", c.file)
				cmd.Env = append(os.Environ(), "TICKETING_SECRET_FILE=/nonexistent/client.secret",
					"TICKETING_DATA_DIR="+t.TempDir())
				out, _ := cmd.CombinedOutput()
				if !strings.Contains(string(out), "/nonexistent/client.secret") || strings.Contains(string(out), c.file+":") {
					t.Errorf("ticketing %s --config %s did not get past the file:\n%s", sub, c.file, out)
				}
			}
		} else {
			t.Logf("ticketing %s has no --config: %s not parsed by the binary", c.sub, c.file)
		}
		for _, k := range []string{"tls-cert", "tls-key", "tls-ca"} {
			if v, ok := set[k]; ok && !strings.HasPrefix(v, "/etc/ticketing/pki/") {
				t.Errorf("%s: %s = %s, want a file under /etc/ticketing/pki", c.file, k, v)
			}
		}
	}
}

// TestMaintainerScripts runs postinst, prerm and postrm against a scratch
// root (DPKG_ROOT) with every command that would touch the real system
// (adduser, getent, dpkg-statoverride, chown, systemctl, deb-systemd-*)
// replaced by a stub that logs its arguments. It also checks that no
// script enables or starts a unit.
func TestMaintainerScripts(t *testing.T) {
	_, _, control := deb(t)
	for _, s := range []string{"postinst", "prerm", "postrm"} {
		run(t, nil, "sh", "-n", filepath.Join(control, s))
		b, _ := os.ReadFile(filepath.Join(control, s))
		if m := regexp.MustCompile(`(?m)^[^#\n]*(systemctl[^\n]*\b(enable|start|restart)\b|deb-systemd-helper\s+enable|deb-systemd-invoke\s+(start|restart))`).Find(b); m != nil {
			t.Errorf("%s enables or starts a unit: %s", s, m)
		}
	}

	dir := t.TempDir()
	stubs, root, log := filepath.Join(dir, "stubs"), filepath.Join(dir, "root"), filepath.Join(dir, "calls")
	if err := os.MkdirAll(stubs, 0o755); err != nil {
		t.Fatal(err)
	}
	// getent and dpkg-statoverride --list answer from marker files, so a
	// second postinst run sees what the first one created.
	stub := map[string]string{
		"getent":             `[ -e "$STUBS/user-exists" ]`,
		"adduser":            `touch "$STUBS/user-exists"`,
		"addgroup":           `:`,
		"dpkg-statoverride":  `case "$1" in --list) [ -e "$STUBS/override" ];; --update|--add) touch "$STUBS/override";; --remove) rm -f "$STUBS/override";; esac`,
		"chown":              `:`,
		"systemctl":          `:`,
		"deb-systemd-helper": `:`,
		"deb-systemd-invoke": `:`,
	}
	for name, body := range stub {
		script := fmt.Sprintf("#!/bin/sh\necho \"%s $*\" >>\"$CALLS\"\n%s\n", name, body)
		if err := os.WriteFile(filepath.Join(stubs, name), []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	env := []string{"PATH=" + stubs + ":/usr/sbin:/usr/bin:/sbin:/bin", "DPKG_ROOT=" + root, "STUBS=" + stubs, "CALLS=" + log}
	calls := func() string {
		b, _ := os.ReadFile(log)
		os.Remove(log)
		return string(b)
	}

	run(t, env, filepath.Join(control, "postinst"), "configure", "")
	got := calls()
	for _, want := range []string{
		"adduser --system --group --quiet --home /var/lib/ticketing --no-create-home ticketing",
		"dpkg-statoverride --update --add root ticketing 0750 /etc/ticketing",
		"chown root:ticketing " + root + "/etc/ticketing/pki",
		"chown ticketing:ticketing " + root + "/var/lib/ticketing",
	} {
		if !strings.Contains(got, want+"\n") {
			t.Errorf("postinst configure: no %q among its calls:\n%s", want, got)
		}
	}
	if strings.Contains(got, "systemctl") || strings.Contains(got, "deb-systemd") {
		t.Errorf("postinst touched systemd under DPKG_ROOT:\n%s", got)
	}
	for _, d := range []string{"etc/ticketing/pki", "var/lib/ticketing"} {
		if fi, err := os.Stat(filepath.Join(root, d)); err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o750 {
			t.Errorf("postinst: /%s: %v %v, want a 0750 directory", d, fi, err)
		}
	}

	// Again (an upgrade from 1.2.2): nothing to create any more, and the data
	// directory is left alone.
	marker := filepath.Join(root, "var/lib/ticketing/raft.db")
	if err := os.WriteFile(marker, []byte("state"), 0o600); err != nil {
		t.Fatal(err)
	}
	run(t, env, filepath.Join(control, "postinst"), "configure", "1.2.2")
	if got := calls(); strings.Contains(got, "adduser") || strings.Contains(got, "--add") || strings.Contains(got, "chown") {
		t.Errorf("second postinst run redid its work:\n%s", got)
	}

	run(t, env, filepath.Join(control, "prerm"), "remove")
	run(t, env, filepath.Join(control, "postrm"), "remove")
	run(t, env, filepath.Join(control, "postrm"), "purge")
	if got := calls(); !strings.Contains(got, "dpkg-statoverride --remove /etc/ticketing\n") {
		t.Errorf("postrm purge kept the stat override:\n%s", got)
	}
	if _, err := os.Stat(marker); err != nil {
		t.Errorf("purge touched the data directory: %v", err)
	}
	cmd := exec.Command(filepath.Join(control, "postinst"), "bogus-action")
	cmd.Env = append(os.Environ(), env...)
	if out, err := cmd.CombinedOutput(); err == nil {
		t.Errorf("postinst bogus-action succeeded:\n%s", out)
	}
}

// TestVersionRule runs build-deb.sh --print-version with a stub git on
// PATH that answers as git does for each kind of checkout. The case that
// went wrong: with no tag, `git describe --tags --always` prints the
// abbreviated hash, and one that starts with a digit (60bffe5) passed for
// a version tag.
func TestVersionRule(t *testing.T) {
	for _, tc := range []struct {
		name     string
		describe string // what `git describe --tags --long --match ...` prints; "" = no tag (exit 128)
		hash     string // what `git rev-parse --short HEAD` prints; "" = not a checkout
		want     string
	}{
		{"no tag, hash starts with a digit", "", "60bffe5", "0.0.0+git60bffe5"},
		{"no tag, hash starts with a letter", "", "c49e9d5", "0.0.0+gitc49e9d5"},
		{"on a v tag", "v1.2.3-0-g60bffe5", "60bffe5", "1.2.3"},
		{"past a v tag", "v1.2.3-4-g0abcdef", "0abcdef", "1.2.3+git4.0abcdef"},
		{"past a bare tag", "2.0.1-12-gabc1234", "abc1234", "2.0.1+git12.abc1234"},
		{"no git checkout", "", "", "0.0.0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bin := t.TempDir()
			stub := fmt.Sprintf(`#!/bin/sh
# A stub git: describe answers like a checkout with or without a tag.
for a; do
	case $a in
	describe)
		for b; do [ "$b" = --always ] && { echo %[2]q; exit 0; }; done
		[ -n %[1]q ] && { echo %[1]q; exit 0; }
		echo "fatal: No names found, cannot describe anything." >&2; exit 128 ;;
	rev-parse)
		[ -n %[2]q ] && { echo %[2]q; exit 0; }
		echo "fatal: not a git repository" >&2; exit 128 ;;
	esac
done
exit 128
`, tc.describe, tc.hash)
			if err := os.WriteFile(filepath.Join(bin, "git"), []byte(stub), 0o755); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command("sh", "./build-deb.sh", "--print-version")
			cmd.Env = append(os.Environ(), "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"), "VERSION=")
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("build-deb.sh --print-version: %v\n%s", err, out)
			}
			if got := strings.TrimSpace(string(out)); got != tc.want {
				t.Fatalf("version %q, want %q", got, tc.want)
			}
		})
	}
}
