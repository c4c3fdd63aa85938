package cli

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// testFlags is a flag set like the commands', with a string, a duration, a
// bool and an int flag, and bootstrap's command-line-only --new-domain.
type testFlags struct {
	dataDir, cluster string
	timeout          time.Duration
	plain, newDomain bool
	maxConns         int
}

func newTestFlags(out *bytes.Buffer) (*flag.FlagSet, *testFlags) {
	fs := flag.NewFlagSet("ticketing test", flag.ContinueOnError)
	fs.SetOutput(out)
	v := &testFlags{}
	fs.StringVar(&v.dataDir, "data-dir", "/default", "")
	fs.StringVar(&v.cluster, "cluster", "", "")
	fs.DurationVar(&v.timeout, "idle-timeout", time.Minute, "")
	fs.BoolVar(&v.plain, "insecure-plaintext", false, "")
	fs.BoolVar(&v.newDomain, "new-domain", false, "")
	fs.IntVar(&v.maxConns, "max-conns", 10, "")
	return fs, v
}

func TestConfigFile(t *testing.T) {
	good := `# a node
data-dir = /var/lib/ticketing/node

   # indented comment
cluster=10.0.0.1:7400,10.0.0.2:7400
idle-timeout = "90s"
insecure-plaintext = true
`
	for _, tc := range []struct {
		name    string
		file    string // "" means no --config
		args    []string
		env     map[string]string
		want    testFlags
		wantErr string // substring of the error; "" means success
	}{
		{name: "no file, defaults", want: testFlags{dataDir: "/default", timeout: time.Minute, maxConns: 10}},
		{name: "good file", file: good, want: testFlags{dataDir: "/var/lib/ticketing/node",
			cluster: "10.0.0.1:7400,10.0.0.2:7400", timeout: 90 * time.Second, plain: true, maxConns: 10}},
		{name: "quotes keep spaces, # and =", file: `data-dir = "/srv/a dir/#1=x"` + "\ncluster = \"\"\n",
			want: testFlags{dataDir: "/srv/a dir/#1=x", timeout: time.Minute, maxConns: 10}},
		{name: "unquoted = in value", file: "cluster = n1=10.0.0.1:7500,n2=10.0.0.2:7500\n",
			want: testFlags{dataDir: "/default", cluster: "n1=10.0.0.1:7500,n2=10.0.0.2:7500", timeout: time.Minute, maxConns: 10}},
		{name: "escaped quote", file: `data-dir = "a\"b"`,
			want: testFlags{dataDir: `a"b`, timeout: time.Minute, maxConns: 10}},
		{name: "env overrides file", file: good,
			env:  map[string]string{"TICKETING_DATA_DIR": "/from/env", "TICKETING_MAX_CONNS": "7", "TICKETING_INSECURE_PLAINTEXT": "false"},
			want: testFlags{dataDir: "/from/env", cluster: "10.0.0.1:7400,10.0.0.2:7400", timeout: 90 * time.Second, maxConns: 7}},
		{name: "empty env is unset", file: good, env: map[string]string{"TICKETING_DATA_DIR": ""},
			want: testFlags{dataDir: "/var/lib/ticketing/node", cluster: "10.0.0.1:7400,10.0.0.2:7400",
				timeout: 90 * time.Second, plain: true, maxConns: 10}},
		{name: "env without file", env: map[string]string{"TICKETING_CLUSTER": "a:1"},
			want: testFlags{dataDir: "/default", cluster: "a:1", timeout: time.Minute, maxConns: 10}},
		{name: "flag overrides env and file", file: good, args: []string{"--data-dir", "/from/flag", "--insecure-plaintext=false"},
			env:  map[string]string{"TICKETING_DATA_DIR": "/from/env"},
			want: testFlags{dataDir: "/from/flag", cluster: "10.0.0.1:7400,10.0.0.2:7400", timeout: 90 * time.Second, maxConns: 10}},
		{name: "flag set to its default still wins", file: good, args: []string{"--data-dir=/default"},
			want: testFlags{dataDir: "/default", cluster: "10.0.0.1:7400,10.0.0.2:7400", timeout: 90 * time.Second, plain: true, maxConns: 10}},
		{name: "command-line-only flag ignores env", env: map[string]string{"TICKETING_NEW_DOMAIN": "true"},
			want: testFlags{dataDir: "/default", timeout: time.Minute, maxConns: 10}},
		{name: "unknown name", file: "data-dir = /x\n\n# c\ndatadir = /y\n", wantErr: `:4: unknown setting "datadir"`},
		{name: "dashes", file: "--data-dir = /x\n", wantErr: `:1: write "--data-dir" without dashes`},
		{name: "no equals", file: "# c\ndata-dir /x\n", wantErr: ":2: want name = value"},
		{name: "no name", file: "= /x\n", wantErr: ":1: missing name"},
		{name: "config in file", file: "config = /etc/other.conf\n", wantErr: ":1: config can only be given on the command line"},
		{name: "new-domain in file", file: "new-domain = true\n", wantErr: ":1: new-domain can only be given on the command line"},
		{name: "duplicate", file: "data-dir = /x\ndata-dir = /y\n", wantErr: ":2: data-dir set again (first on line 1)"},
		{name: "bad quotes", file: `data-dir = "/x` + "\n", wantErr: ":1: bad quoted value"},
		{name: "bad value", file: "cluster = a\nidle-timeout = soon\n", wantErr: `:2: invalid value "soon" for idle-timeout`},
		{name: "bad bool", file: "insecure-plaintext = yes\n", wantErr: `:1: invalid value "yes" for insecure-plaintext`},
		{name: "bad env value", env: map[string]string{"TICKETING_MAX_CONNS": "many"}, wantErr: `$TICKETING_MAX_CONNS: invalid value "many"`},
		// A bad env value of a flag given on the command line is not read.
		{name: "flag hides bad env", args: []string{"--max-conns=3"}, env: map[string]string{"TICKETING_MAX_CONNS": "many"},
			want: testFlags{dataDir: "/default", timeout: time.Minute, maxConns: 3}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, name := range []string{"TICKETING_DATA_DIR", "TICKETING_CLUSTER", "TICKETING_IDLE_TIMEOUT",
				"TICKETING_INSECURE_PLAINTEXT", "TICKETING_NEW_DOMAIN", "TICKETING_MAX_CONNS", "TICKETING_CONFIG"} {
				t.Setenv(name, "") // empty counts as unset
			}
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			args := tc.args
			path := filepath.Join(t.TempDir(), "test.conf")
			if tc.file != "" {
				if err := os.WriteFile(path, []byte(tc.file), 0o600); err != nil {
					t.Fatal(err)
				}
				args = append([]string{"--config", path}, args...)
			}
			var out bytes.Buffer
			fs, got := newTestFlags(&out)
			err := parseConfigured(fs, args)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tc.wantErr)
				}
				if tc.file != "" && !strings.Contains(err.Error(), path+":") && !strings.HasPrefix(tc.wantErr, "$") {
					t.Fatalf("err %v does not name the file", err)
				}
				if !strings.Contains(out.String(), "ticketing test: ") {
					t.Fatalf("error not reported on the flag set's output: %q", out.String())
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if *got != tc.want {
				t.Fatalf("got %+v\nwant %+v", *got, tc.want)
			}
		})
	}
}

// A missing --config file is an error; --new-domain still works on the
// command line.
func TestConfigFileMissingAndCommandLineOnly(t *testing.T) {
	var out bytes.Buffer
	fs, _ := newTestFlags(&out)
	if err := parseConfigured(fs, []string{"--config", filepath.Join(t.TempDir(), "nope.conf")}); err == nil ||
		!strings.Contains(err.Error(), "nope.conf") {
		t.Fatalf("missing file: %v", err)
	}
	fs, got := newTestFlags(&out)
	if err := parseConfigured(fs, []string{"--new-domain"}); err != nil || !got.newDomain {
		t.Fatalf("--new-domain: %v %v", err, got.newDomain)
	}
	if envName("peer-secret-file") != "TICKETING_PEER_SECRET_FILE" {
		t.Fatal(envName("peer-secret-file"))
	}
}

// The real commands take --config: a node file that names an unknown
// setting is refused with its line, before anything starts.
func TestCommandsTakeConfig(t *testing.T) {
	dir := t.TempDir()
	conf := filepath.Join(dir, "node.conf")
	if err := os.WriteFile(conf, []byte("# any command\nlog-level = debug\nno-such-flag = 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, cmd := range []string{"node", "bootstrap", "sidecar"} {
		var out, errb bytes.Buffer
		code := Main([]string{cmd, "--config", conf}, &out, &errb)
		if code != ExitUsage || !strings.Contains(errb.String(), conf+":3: unknown setting") {
			t.Fatalf("%s: exit %d, stderr %q", cmd, code, errb.String())
		}
	}
}
