package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// resolveArgs parses args as `ticketing status` does and resolves the
// connection with env as the environment.
func resolveArgs(t *testing.T, env map[string]string, args ...string) (*adminFlags, error) {
	t.Helper()
	fl, af := newAdminFlagSet("ticketing status", "ticketing status", "", io.Discard, io.Discard)
	if err := fl.Parse(args); err != nil {
		t.Fatal(err)
	}
	return af, af.resolve(fl.FlagSet, func(k string) (string, bool) { v, ok := env[k]; return v, ok })
}

func writeConf(t *testing.T, dir, name, body string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// Flags win over the environment, the environment over --config.
func TestAdminConnectionPrecedence(t *testing.T) {
	dir := t.TempDir()
	conf := writeConf(t, dir, "node.conf", `# a node's own file: every node setting is accepted
id = n1
cluster-id = prod
peers = "n1=10.0.0.1:7500,n2=10.0.0.2:7500,n3=10.0.0.3:7500"
data-dir = /var/lib/ticketing
client-addr = 10.0.0.1:7400
peer-addr = 10.0.0.1:7500
admin-addr = 10.0.0.1:7600
secret-file = /etc/ticketing/client.secret
admin-secret-file = /etc/ticketing/admin.secret   # the admin secret
tls-ca = /etc/ticketing/pki/ca.crt
log-level = info
`)
	env := map[string]string{
		"TICKETING_ADMIN": "127.0.0.9:1", "TICKETING_ADMIN_SECRET_FILE": "env.secret",
		"TICKETING_TLS_CA": "env-ca.crt", "TICKETING_CLUSTER_ID": "envid",
	}
	type conn struct{ admin, secret, ca, id string }
	got := func(af *adminFlags) conn { return conn{af.addrs, af.secretFile, af.tf.files.CAFile, af.clusterID} }
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
		want conn
	}{
		{"file alone", nil, []string{"--config", conf},
			conn{"10.0.0.1:7600,10.0.0.2:7600,10.0.0.3:7600", "/etc/ticketing/admin.secret", "/etc/ticketing/pki/ca.crt", "prod"}},
		{"env over file", env, []string{"--config", conf}, conn{"127.0.0.9:1", "env.secret", "env-ca.crt", "envid"}},
		{"env alone", env, nil, conn{"127.0.0.9:1", "env.secret", "env-ca.crt", "envid"}},
		{"empty env is unset", map[string]string{"TICKETING_ADMIN": ""}, []string{"--config", conf},
			conn{"10.0.0.1:7600,10.0.0.2:7600,10.0.0.3:7600", "/etc/ticketing/admin.secret", "/etc/ticketing/pki/ca.crt", "prod"}},
		{"flags over env and file", env, []string{"--config", conf, "--admin", "127.0.0.1:7", "--admin-secret-file", "f.secret",
			"--tls-ca", "f-ca.crt", "--cluster-id", "fid"}, conn{"127.0.0.1:7", "f.secret", "f-ca.crt", "fid"}},
		{"one flag, the rest from env", env, []string{"--cluster-id", "fid"}, conn{"127.0.0.9:1", "env.secret", "env-ca.crt", "fid"}},
	} {
		af, err := resolveArgs(t, tc.env, tc.args...)
		if err != nil || got(af) != tc.want {
			t.Errorf("%s: %+v, %v; want %+v", tc.name, got(af), err, tc.want)
		}
	}
}

// What --config derives from a node's file: a wildcard admin-addr is
// dialled at the node's own peer host; plaintext allowed there is allowed
// here; a file without admin-addr, or with a bad line, says so.
func TestAdminConnectionFromNodeConfig(t *testing.T) {
	dir := t.TempDir()
	conf := writeConf(t, dir, "wild.conf", "id = n2\npeers = n1=10.0.0.1:7500,n2=10.0.0.2:7500,n3=10.0.0.3:7500\n"+
		"admin-addr = 0.0.0.0:7600\nadmin-secret-file = a.secret\ninsecure-plaintext = true\n")
	af, err := resolveArgs(t, nil, "--config", conf)
	if err != nil || af.addrs != "10.0.0.2:7600,10.0.0.1:7600,10.0.0.3:7600" || !af.tf.insecure || af.tf.files.CAFile != "" {
		t.Errorf("wildcard admin-addr: %q insecure %v ca %q, %v", af.addrs, af.tf.insecure, af.tf.files.CAFile, err)
	}
	conf = writeConf(t, dir, "lone.conf", "admin-addr = :7600\nadmin-secret-file = a.secret\n")
	if af, err := resolveArgs(t, nil, "--config", conf); err != nil || af.addrs != "127.0.0.1:7600" {
		t.Errorf("no peers, wildcard admin-addr: %q, %v", af.addrs, err)
	}
	conf = writeConf(t, dir, "noadmin.conf", "id = n1\nclient-addr = 10.0.0.1:7400\n")
	if _, err := resolveArgs(t, nil, "--config", conf); !errors.Is(err, errNoAdminAddr) || !strings.Contains(err.Error(), conf) {
		t.Errorf("no admin-addr: %v", err)
	}
	conf = writeConf(t, dir, "bad.conf", "admin-addr = 10.0.0.1:7600\nthis is not a setting\n")
	if _, err := resolveArgs(t, nil, "--config", conf); err == nil || !strings.Contains(err.Error(), conf+":2:") {
		t.Errorf("bad line: %v", err)
	}
	if _, err := resolveArgs(t, nil, "--config", filepath.Join(dir, "missing.conf")); err == nil {
		t.Error("a missing --config file: no error")
	}
}

// The export line ticketing dev prints is valid sh and sets the four
// variables, whatever the paths hold.
func TestAdminExportLine(t *testing.T) {
	line := adminExportLine([]string{"127.0.0.1:7600", "127.0.0.1:7601"}, "/tmp/a dir/admin.secret", "/tmp/it's/ca.crt", "dev")
	out, err := exec.Command("sh", "-c", line+`; printf '%s|%s|%s|%s' "$TICKETING_ADMIN" "$TICKETING_ADMIN_SECRET_FILE" "$TICKETING_TLS_CA" "$TICKETING_CLUSTER_ID"`).CombinedOutput()
	if want := "127.0.0.1:7600,127.0.0.1:7601|/tmp/a dir/admin.secret|/tmp/it's/ca.crt|dev"; err != nil || string(out) != want {
		t.Errorf("%s\n→ %q, %v; want %q", line, out, err, want)
	}
}

// status, members list and inspect against a real cluster with nothing
// but the environment, and with nothing but a node's configuration file.
func TestAdminCommandsFromEnvAndConfig(t *testing.T) {
	c, flags := adminTestCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	li, err := c.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	val := func(name string) string {
		for i := 0; i+1 < len(flags); i++ {
			if flags[i] == "--"+name {
				return flags[i+1]
			}
		}
		t.Fatalf("no %s in %q", name, flags)
		return ""
	}
	runOp := func(args ...string) (int, string) {
		var out, errb bytes.Buffer
		code := Main(args, &out, &errb)
		return code, out.String() + errb.String()
	}
	check := func(how string) {
		t.Helper()
		if code, out := runOp("status"); code != ExitOK || !strings.Contains(out, "(leader, serving)") {
			t.Errorf("%s: status: exit %d\n%s", how, code, out)
		}
		if code, out := runOp("members", "list"); code != ExitOK || strings.Count(out, " yes ") != 3 {
			t.Errorf("%s: members list: exit %d\n%s", how, code, out)
		}
		if code, out := runOp("inspect", "env/k"); code != ExitOK || !strings.Contains(out, "Holder:       none") {
			t.Errorf("%s: inspect: exit %d\n%s", how, code, out)
		}
	}
	// Without anything: the error says what is missing and where from.
	if code, out := runOp("status"); code != ExitUsage || !strings.Contains(out, "$TICKETING_ADMIN") {
		t.Fatalf("status with no connection: exit %d\n%s", code, out)
	}
	t.Setenv("TICKETING_ADMIN", val("admin"))
	t.Setenv("TICKETING_ADMIN_SECRET_FILE", val("admin-secret-file"))
	t.Setenv("TICKETING_TLS_CA", val("tls-ca"))
	t.Setenv("TICKETING_CLUSTER_ID", val("cluster-id"))
	check("environment")
	// A flag wins over the environment: a wrong cluster id is refused.
	if code, out := runOp("status", "--cluster-id", "other"); code != ExitError || !strings.Contains(out, "--cluster-id") {
		t.Errorf("--cluster-id other over the environment: exit %d\n%s", code, out)
	}
	// The leader's own configuration file, the environment empty.
	for _, k := range []string{"TICKETING_ADMIN", "TICKETING_ADMIN_SECRET_FILE", "TICKETING_TLS_CA", "TICKETING_CLUSTER_ID"} {
		t.Setenv(k, "")
	}
	conf := writeConf(t, t.TempDir(), "node.conf", fmt.Sprintf("id = %s\ncluster-id = %s\nadmin-addr = %s\n"+
		"admin-secret-file = %s\ntls-ca = %s\ndata-dir = /nonexistent\n", c.ID(li), val("cluster-id"), c.AdminAddr(li),
		val("admin-secret-file"), val("tls-ca")))
	for _, args := range [][]string{{"status", "--config", conf}, {"members", "list", "--config", conf},
		{"inspect", "env/k", "--config", conf}} {
		if code, out := runOp(args...); code != ExitOK {
			t.Errorf("%q: exit %d\n%s", args, code, out)
		}
	}
}
