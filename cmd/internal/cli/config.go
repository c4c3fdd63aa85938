package cli

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Configuration files and environment variables for the long-running
// commands (node, bootstrap, sidecar). A setting's name is its flag's long
// name: "data-dir = /var/lib/ticketing/node" in the file, and
// TICKETING_DATA_DIR in the environment. Precedence, highest first: the
// command line, the environment, the file, the flag's default.

// configFlag is the flag naming the configuration file.
const configFlag = "config"

// cmdlineOnly are the flags that are never read from the file or the
// environment: --config itself, and --new-domain, which bootstrap wants
// said out loud on the command line.
var cmdlineOnly = map[string]bool{configFlag: true, "new-domain": true}

// envName is the environment variable for flag name: TICKETING_ and the
// name in upper case with dashes as underscores.
func envName(name string) string {
	return "TICKETING_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// parseConfigured registers --config on fs, parses args, and then gives
// every flag not set on the command line the value of its environment
// variable (when set and not empty), else its value in the --config file
// (when there). A bad file or value is reported on fs.Output(), prefixed
// with fs.Name(), and returned; flag.Parse errors are reported by fs as
// usual.
func parseConfigured(fs *flag.FlagSet, args []string) error {
	path := fs.String(configFlag, "", "read settings from `FILE`: name = value lines, named like the long flags "+
		"(precedence: command line, then $TICKETING_<NAME>, then FILE, then the default)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := applyConfig(fs, *path, os.LookupEnv); err != nil {
		fmt.Fprintf(fs.Output(), "%s: %v\n", fs.Name(), err)
		return err
	}
	return nil
}

// applyConfig is parseConfigured's second half, after fs.Parse: file ""
// means no file.
func applyConfig(fs *flag.FlagSet, file string, lookupEnv func(string) (string, bool)) error {
	var settings map[string]setting
	if file != "" {
		var err error
		if settings, err = readConfigFile(file, fs); err != nil {
			return err
		}
	}
	explicit := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { explicit[f.Name] = true })
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if err != nil || explicit[f.Name] || cmdlineOnly[f.Name] {
			return
		}
		if v, ok := lookupEnv(envName(f.Name)); ok && v != "" {
			if serr := fs.Set(f.Name, v); serr != nil {
				err = fmt.Errorf("$%s: invalid value %q: %v", envName(f.Name), v, serr)
			}
			return
		}
		if s, ok := settings[f.Name]; ok {
			if serr := fs.Set(f.Name, s.value); serr != nil {
				err = fmt.Errorf("%s:%d: invalid value %q for %s: %v", file, s.line, s.value, f.Name, serr)
			}
		}
	})
	return err
}

type setting struct {
	value string
	line  int
}

// readConfigFile parses a configuration file: one "name = value" a line,
// where name is one of fs's flags; "#" starts a comment line, and a "#"
// after white space ends a value and starts a comment ("log-level = info
// # quiet"); blank lines are ignored; a value may be double-quoted (Go
// string syntax, so \" and \\ inside), and then keeps every "#" and space
// inside the quotes. Errors name the file and line.
func readConfigFile(path string, fs *flag.FlagSet) (map[string]setting, error) {
	return readSettings(path, func(name string) error {
		switch {
		case cmdlineOnly[name]:
			return fmt.Errorf("%s can only be given on the command line", name)
		case fs.Lookup(name) == nil:
			return fmt.Errorf("unknown setting %q (see '%s -h')", name, fs.Name())
		}
		return nil
	})
}

// readSettings parses a configuration file as readConfigFile describes,
// asking check about every name (a non-nil error refuses the line).
func readSettings(path string, check func(name string) error) (map[string]setting, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("--config: %w", err)
	}
	defer f.Close()
	out := map[string]setting{}
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		bad := func(format string, a ...any) error {
			return fmt.Errorf("%s:%d: "+format, append([]any{path, n}, a...)...)
		}
		name, value, ok := strings.Cut(line, "=")
		if !ok {
			return nil, bad("want name = value, got %q", line)
		}
		name, value = strings.TrimSpace(name), strings.TrimSpace(value)
		switch {
		case name == "":
			return nil, bad("missing name before '='")
		case strings.HasPrefix(name, "-"):
			return nil, bad("write %q without dashes", name)
		}
		if err := check(name); err != nil {
			return nil, bad("%v", err)
		}
		if prev, dup := out[name]; dup {
			return nil, bad("%s set again (first on line %d)", name, prev.line)
		}
		if strings.HasPrefix(value, `"`) {
			q, err := strconv.QuotedPrefix(value)
			if err != nil {
				return nil, bad("bad quoted value %s", value)
			}
			if rest := strings.TrimSpace(value[len(q):]); rest != "" && !strings.HasPrefix(rest, "#") {
				return nil, bad("%s: text %q after the closing quote (a comment starts with #)", name, rest)
			}
			value, _ = strconv.Unquote(q)
		} else {
			value = cutComment(value)
		}
		out[name] = setting{value: value, line: n}
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, fmt.Errorf("%s: a line longer than %d bytes", path, bufio.MaxScanTokenSize)
		}
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return out, nil
}

// cutComment returns an unquoted value without its trailing comment: from
// the first "#" that starts the value or follows a space or tab.
func cutComment(value string) string {
	for i := 0; i < len(value); i++ {
		if value[i] == '#' && (i == 0 || value[i-1] == ' ' || value[i-1] == '\t') {
			return strings.TrimSpace(value[:i])
		}
	}
	return value
}
