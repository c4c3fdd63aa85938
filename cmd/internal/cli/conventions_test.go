package cli

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// runMain runs Main in process and returns its exit code, stdout and stderr.
func runMain(args ...string) (int, string, string) {
	var out, errb bytes.Buffer
	code := Main(args, &out, &errb)
	return code, out.String(), errb.String()
}

// invocation is one command line of the product binary, with what a bad
// invocation of it exits with.
type invocation struct {
	args    []string // the command (and subcommand)
	badCode int
}

// productInvocations are every command and subcommand with flags of its
// own: commands(), plus certs' kinds and completion.
func productInvocations(t *testing.T) []invocation {
	var out []invocation
	for _, c := range commands() {
		code := ExitUsage
		switch c.name {
		case "lock", "acquire", "release", "ping", "info", "permits":
			code = ExitLockUsage // EX_USAGE, their documented code (unixapi/PROTOCOL.md)
		}
		out = append(out, invocation{[]string{c.name}, code})
	}
	for _, kind := range subcommands["certs"] {
		out = append(out, invocation{[]string{"certs", kind}, ExitUsage})
	}
	out = append(out, invocation{[]string{"completion"}, ExitUsage})
	if len(out) < 15 {
		t.Fatalf("only %d invocations", len(out))
	}
	return out
}

// -h and --help print the whole usage on stdout and exit 0, on every
// command; nothing goes to stderr.
func TestHelpOnStdoutExitsZero(t *testing.T) {
	for _, inv := range productInvocations(t) {
		for _, h := range []string{"-h", "--help"} {
			args := append(append([]string{}, inv.args...), h)
			code, out, errs := runMain(args...)
			if code != ExitOK || errs != "" {
				t.Errorf("%q: exit %d, stderr %q; want 0 and nothing on stderr", args, code, errs)
			}
			if !strings.HasPrefix(out, "usage: ticketing "+strings.Join(inv.args, " ")) {
				t.Errorf("%q: stdout does not start with the usage line:\n%s", args, out)
			}
		}
	}
	for _, h := range []string{"-h", "--help", "help"} {
		if code, out, errs := runMain(h); code != ExitOK || errs != "" || !strings.Contains(out, "commands:") {
			t.Errorf("ticketing %s: exit %d\nstdout %q\nstderr %q", h, code, out, errs)
		}
	}
}

// Each client command's -h lists the exit codes it can return: lock's
// COMMAND and its 80 belong to lock alone; all list 64 and 69.
func TestClientHelpListsItsOwnExitCodes(t *testing.T) {
	for _, name := range []string{"lock", "acquire", "release", "ping", "info", "permits"} {
		code, out, _ := runMain(name, "-h")
		_, codes, ok := strings.Cut(out, "\nexit codes: ")
		if code != ExitOK || !ok {
			t.Fatalf("%s -h: exit %d, no exit codes in\n%s", name, code, out)
		}
		for _, want := range []string{"64 usage", "69 unavailable", "78 any other error"} {
			if !strings.Contains(codes, want) {
				t.Errorf("%s -h: exit codes without %q:\n%s", name, want, codes)
			}
		}
		lockOnly := strings.Contains(codes, "COMMAND") || strings.Contains(codes, "80 the lock was")
		if lockOnly != (name == "lock") {
			t.Errorf("%s -h: mentions COMMAND or 80: %v, want %v:\n%s", name, lockOnly, name == "lock", codes)
		}
		for _, l := range strings.Split("exit codes: "+codes, "\n") {
			if len(l) > 80 {
				t.Errorf("%s -h: line of %d characters: %q", name, len(l), l)
			}
		}
	}
}

// A bad invocation prints one line saying why, then the usage line, on
// stderr (nothing on stdout), and exits 2 (64, EX_USAGE, for the client
// commands):
// an unknown flag, a flag without its value, and a stray argument.
func TestBadInvocationOneLineThenUsage(t *testing.T) {
	for _, inv := range productInvocations(t) {
		name := "ticketing " + strings.Join(inv.args, " ")
		for _, bad := range [][]string{{"--no-such-flag"}, {"-definitely-not"}} {
			args := append(append([]string{}, inv.args...), bad...)
			code, out, errs := runMain(args...)
			lines := strings.Split(strings.TrimRight(errs, "\n"), "\n")
			if code != inv.badCode || out != "" || len(lines) < 2 {
				t.Errorf("%q: exit %d (want %d), stdout %q, stderr %q", args, code, inv.badCode, out, errs)
				continue
			}
			if !strings.HasPrefix(lines[0], name+": ") || !strings.Contains(lines[0], "not defined") {
				t.Errorf("%q: first line %q does not say why", args, lines[0])
			}
			if !strings.HasPrefix(lines[1], "usage: "+name) {
				t.Errorf("%q: second line %q is not the usage", args, lines[1])
			}
		}
	}
	// Wrong arguments, per command.
	for _, tc := range []struct {
		args []string
		code int
		why  string
	}{
		{nil, ExitUsage, "ticketing: no command given"},
		{[]string{"explode"}, ExitUsage, `ticketing: unknown command "explode"`},
		{[]string{"dev", "extra"}, ExitUsage, `ticketing dev: unexpected arguments`},
		{[]string{"dev", "--nodes", "4"}, ExitUsage, "ticketing dev: --nodes 4: want 3 or 5"},
		{[]string{"node", "extra"}, ExitUsage, "ticketing node: unexpected arguments"},
		{[]string{"sidecar"}, ExitUsage, "ticketing sidecar: --cluster and --secret-file are required"},
		{[]string{"certs"}, ExitUsage, "ticketing certs: want the kind"},
		{[]string{"certs", "server"}, ExitUsage, `ticketing certs: unknown kind "server"`},
		{[]string{"certs", "ca"}, ExitUsage, "ticketing certs ca: --dir is required"},
		{[]string{"members"}, ExitUsage, "ticketing members: want a COMMAND"},
		{[]string{"status", "extra"}, ExitUsage, "ticketing status: want no arguments"},
		{[]string{"inspect"}, ExitUsage, "ticketing inspect: want the KEY"},
		{[]string{"inspect", "a", "b"}, ExitUsage, "ticketing inspect: want one KEY"},
		{[]string{"lock"}, ExitLockUsage, "ticketing lock: want KEY and a COMMAND"},
		{[]string{"lock", "k"}, ExitLockUsage, "ticketing lock: want a COMMAND to run"},
		{[]string{"acquire"}, ExitLockUsage, "ticketing acquire: want one KEY"},
		{[]string{"release", "k"}, ExitLockUsage, "ticketing release: want KEY and TOKEN"},
		{[]string{"ping", "x"}, ExitLockUsage, "ticketing ping: want no arguments"},
		{[]string{"permits"}, ExitLockUsage, "ticketing permits: want the subcommand set"},
		{[]string{"permits", "set", "k"}, ExitLockUsage, "ticketing permits: want KEY and N"},
		{[]string{"permits", "set", "k", "-1"}, ExitLockUsage, `ticketing permits: N "-1"`},
		{[]string{"lock", "--permit", "a", "b", "--", "true"}, ExitLockUsage, "ticketing lock: --permit takes one KEY"},
		{[]string{"completion"}, ExitUsage, "ticketing completion: want the shell"},
		{[]string{"completion", "fish"}, ExitUsage, "ticketing completion: want the shell"},
	} {
		code, out, errs := runMain(tc.args...)
		if code != tc.code || out != "" || !strings.HasPrefix(errs, tc.why) || !strings.Contains(errs, "\nusage: ") {
			t.Errorf("%q: exit %d (want %d), stdout %q, stderr %q; want it to start with %q, then the usage",
				tc.args, code, tc.code, out, errs, tc.why)
		}
	}
}

// Values are reported in the units the user typed, and a bad token is
// not a raw strconv error. None of these reaches the socket.
func TestValuesInTheUnitsTyped(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "none.sock")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"lock", "--lease", "300", "k", "--", "true"}, "--lease 300: want whole seconds 1..250"},
		{[]string{"lock", "--lease", "251", "k", "--", "true"}, "--lease 251: want whole seconds 1..250"},
		{[]string{"acquire", "--lease", "0", "k"}, "--lease 0: want whole seconds 1..250"},
		{[]string{"lock", "--wait", "3601", "k", "--", "true"}, "--wait 3601: want seconds 0..3600"},
		{[]string{"acquire", "--wait", "0.0005", "k"}, "--wait 0.0005: want seconds 0..3600 with at most 3 decimals"},
		{[]string{"acquire", "--wait", "-1", "k"}, "--wait -1: want seconds 0..3600"},
		{[]string{"release", "seats/1", "abc"}, `token "abc": want the decimal token`},
		{[]string{"release", "seats/1", "0"}, `token "0": want the decimal token`},
	} {
		args := append([]string{tc.args[0], "--socket", sock}, tc.args[1:]...)
		code, _, errs := runMain(args...)
		first, _, _ := strings.Cut(errs, "\n")
		if code != ExitLockUsage || !strings.Contains(first, tc.want) {
			t.Errorf("%q: exit %d, first line %q; want 64 and %q", args, code, first, tc.want)
		}
		for _, never := range []string{"strconv", "m0s", "m11s", "dial"} {
			if strings.Contains(errs, never) {
				t.Errorf("%q: stderr %q says %q", args, errs, never)
			}
		}
	}
}

// A missing or stale socket: the error names the path and what to start,
// and the exit code is 69 (EX_UNAVAILABLE: retry once a sidecar serves).
func TestNoSidecarSaysWhatToRun(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "missing.sock")
	for _, args := range [][]string{
		{"lock", "--socket", sock, "k", "--", "true"},
		{"acquire", "--socket", sock, "k"},
		{"release", "--socket", sock, "k", "1"},
		{"ping", "--socket", sock},
		{"info", "--socket", sock},
	} {
		code, _, errs := runMain(args...)
		if code != ExitUnavailable || !strings.Contains(errs, sock) || !strings.Contains(errs, "ticketing dev") ||
			!strings.Contains(errs, "ticketing sidecar") || strings.Count(strings.TrimSpace(errs), "\n") != 0 {
			t.Errorf("%q: exit %d, stderr %q", args, code, errs)
		}
	}
}

// --version: the version, the commit and the Go version.
func TestVersion(t *testing.T) {
	for _, arg := range []string{"--version", "-version", "version"} {
		code, out, errs := runMain(arg)
		if code != ExitOK || errs != "" ||
			!regexp.MustCompile(`^ticketing \S+, commit \S+.*, go1\.\d+\S* \w+/\w+\n$`).MatchString(out) {
			t.Errorf("%s: exit %d, stdout %q, stderr %q", arg, code, out, errs)
		}
	}
	old := Version
	Version = "1.2.3"
	defer func() { Version = old }()
	if _, out, _ := runMain("--version"); !strings.HasPrefix(out, "ticketing 1.2.3, commit ") {
		t.Errorf("with Version set: %q", out)
	}
}

// Config-file values that parse but fail a check name FILE:LINE and the
// setting; a trailing # comment is a comment.
func TestConfigErrorsNameFileAndLine(t *testing.T) {
	dir := t.TempDir()
	sec := secretFile(t, dir, "c.secret")
	peer := filepath.Join(dir, "p.secret")
	if err := os.WriteFile(peer, []byte("fedcba9876543210fedcba9876543210\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	write := func(body string) string {
		p := filepath.Join(dir, "x.conf")
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, tc := range []struct {
		cmd, body, want string
	}{
		{"node", "# n1\nlog-format = xml\n", `:2: invalid value "xml" for log-format: want text or json`},
		{"sidecar", "\n\nlog-level = loud\n", `:3: invalid value "loud" for log-level: want debug, info, warn or error`},
		{"sidecar", "socket-mode = 999\n", `:1: invalid value "999" for socket-mode: want octal permission bits`},
		{"sidecar", "allow-uid = 1000,bob\n", `:1: invalid value "1000,bob" for allow-uid`},
		{"sidecar", "sessions = on\n", `:1: invalid value "on" for sessions: want auto or off`},
		{"sidecar", "# short\nsession-timeout = 1s\n", `:2: invalid value "1s" for session-timeout: want a duration 2s..300s in whole milliseconds`},
		{"node", "id = n1\npeers = n1=127.0.0.1:1\n", `:2: invalid value "n1=127.0.0.1:1" for peers`},
		{"node", `data-dir = "/x" trailing` + "\n", `:1: data-dir: text "trailing" after the closing quote`},
	} {
		conf := write(tc.body)
		code, _, errs := runMain(tc.cmd, "--config", conf)
		if code != ExitUsage || !strings.Contains(errs, conf+tc.want) {
			t.Errorf("%s with %q: exit %d, stderr %q; want %q", tc.cmd, tc.body, code, errs, conf+tc.want)
		}
	}
	// A trailing comment is a comment: this sidecar file is valid as far
	// as the flags go (it stops later, at the plaintext rule for a remote
	// address, which names no setting of the file).
	conf := write("log-level = info # trailing comment\nsecret-file = " + sec + "   # the client secret\n" +
		"cluster = 10.9.9.9:7400 # one node\nsocket = \"" + filepath.Join(dir, "#s.sock") + "\" # quoted keeps its #\n")
	code, _, errs := runMain("sidecar", "--config", conf)
	if code != ExitUsage || !strings.Contains(errs, "refusing to start") || !strings.Contains(errs, `"10.9.9.9:7400"`) {
		t.Errorf("trailing comments: exit %d, stderr %q", code, errs)
	}
}

// The bash completion script is valid bash and completes commands,
// subcommands and flags.
func TestBashCompletion(t *testing.T) {
	code, script, errs := runMain("completion", "bash")
	if code != ExitOK || errs != "" {
		t.Fatalf("completion bash: exit %d, stderr %q", code, errs)
	}
	if _, err := exec.LookPath("bash"); err != nil {
		t.Fatalf("bash: %v", err)
	}
	complete := func(words ...string) string {
		sh := script + "\nCOMP_WORDS=(" + strings.Join(words, " ") + ")\nCOMP_CWORD=" +
			strconv.Itoa(len(words)-1) + "\n_ticketing\necho \"${COMPREPLY[*]}\"\n"
		out, err := exec.Command("bash", "-c", sh).CombinedOutput()
		if err != nil {
			t.Fatalf("bash: %v\n%s", err, out)
		}
		return strings.TrimSpace(string(out))
	}
	for _, tc := range []struct {
		words []string
		want  string
	}{
		{[]string{"ticketing", "lo"}, "lock"},
		{[]string{"ticketing", "lock", "--le"}, "--lease"},
		{[]string{"ticketing", "members", "rep"}, "replace"},
		{[]string{"ticketing", "members", "list", "--admin-s"}, "--admin-secret-file"},
		{[]string{"ticketing", "certs", "n"}, "node"},
		{[]string{"ticketing", "pe"}, "permits"},
		{[]string{"ticketing", "permits", "s"}, "set"},
		{[]string{"ticketing", "lock", "--perm"}, "--permit"},
		{[]string{"ticketing", "certs", "node", "--ho"}, "--host"},
		{[]string{"ticketing", "node", "--peer-s"}, "--peer-secret-file"},
		{[]string{"ticketing", "sidecar", "--socket-m"}, "--socket-mode"},
		{[]string{"ticketing", "--vers"}, "--version"},
	} {
		if got := complete(tc.words...); got != tc.want {
			t.Errorf("completing %q: %q, want %q", tc.words, got, tc.want)
		}
	}
}
