// Package labcli holds the conventions every ticketlab subcommand shares:
// how flags are parsed (-h prints the usage to stdout and exits 0; a bad
// invocation exits 2 with a one-line reason before the usage, on stderr)
// and which ticketing binary the lab drives (--binary).
package labcli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Exit codes.
const (
	ExitOK    = 0
	ExitError = 1 // the run failed
	ExitUsage = 2 // bad flags or arguments
)

// NewFlagSet returns a flag set named name (e.g. "ticketlab bench
// failover") with the lab's usage text.
func NewFlagSet(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: %s [flags]\n\nflags:\n", name)
		fs.PrintDefaults()
	}
	return fs
}

// Parse parses args into fs. It returns ok when the command should run;
// otherwise code is the exit code to return: ExitOK after -h/--help (the
// usage on stdout), ExitUsage after a bad flag or a stray argument (one
// line saying why, then the usage, on stderr).
func Parse(fs *flag.FlagSet, args []string, stdout, stderr io.Writer) (code int, ok bool) {
	fs.SetOutput(io.Discard)
	err := fs.Parse(args)
	if errors.Is(err, flag.ErrHelp) {
		fs.SetOutput(stdout)
		fs.Usage()
		return ExitOK, false
	}
	if err == nil && fs.NArg() > 0 {
		err = fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if err != nil {
		return Usage(fs, stderr, err.Error()), false
	}
	fs.SetOutput(stderr)
	return ExitOK, true
}

// Usage reports a bad invocation: fs's name and why on one line, then the
// usage, on stderr. It returns ExitUsage.
func Usage(fs *flag.FlagSet, stderr io.Writer, why string) int {
	fmt.Fprintf(stderr, "%s: %s\n", fs.Name(), why)
	fs.SetOutput(stderr)
	fs.Usage()
	return ExitUsage
}

// BinaryFlag registers --binary on fs.
func BinaryFlag(fs *flag.FlagSet) *string {
	return fs.String("binary", "", "the ticketing executable to drive, a `PATH` (default: ticketing on $PATH, else ./bin/ticketing, which make build writes)")
}

// ErrNoBinary is returned by Binary when no ticketing executable is found.
var ErrNoBinary = errors.New("labcli: no ticketing binary: give --binary, put ticketing on $PATH, or run `make build` (bin/ticketing)")

// Binary resolves the --binary value: the path given, else ticketing on
// $PATH, else bin/ticketing in the working directory. The result is
// absolute, so it stays right when the lab changes directory.
func Binary(flagValue string) (string, error) {
	p := flagValue
	if p == "" {
		if lp, err := exec.LookPath("ticketing"); err == nil {
			p = lp
		} else if fi, err := os.Stat(filepath.Join("bin", "ticketing")); err == nil && !fi.IsDir() {
			p = filepath.Join("bin", "ticketing")
		} else {
			return "", ErrNoBinary
		}
	}
	fi, err := os.Stat(p)
	if err != nil {
		return "", fmt.Errorf("--binary: %w", err)
	}
	if fi.IsDir() || fi.Mode().Perm()&0o111 == 0 {
		return "", fmt.Errorf("--binary: %s is not an executable", p)
	}
	return filepath.Abs(p)
}

// Subcommand is one entry of a command's table of subcommands.
type Subcommand struct {
	Name, Summary string
	Run           func(ctx context.Context, args []string, stdout, stderr io.Writer) int
}

// Dispatch runs the subcommand of subs that args[0] names, with the rest
// of args. prog is the command ("ticketlab bench") and noun what its
// subcommands are called ("benchmark"): no name, an unknown one or -h
// print the table (on stdout for -h, exit 0; else on stderr, ExitUsage).
func Dispatch(ctx context.Context, prog, noun string, subs []Subcommand, args []string, stdout, stderr io.Writer) int {
	usage := func(w io.Writer) {
		width := 0
		for _, s := range subs {
			width = max(width, len(s.Name))
		}
		upper := strings.ToUpper(noun)
		fmt.Fprintf(w, "usage: %s %s [flags]\n\n%ss:\n", prog, upper, noun)
		for _, s := range subs {
			fmt.Fprintf(w, "  %-*s  %s\n", width, s.Name, s.Summary)
		}
		fmt.Fprintf(w, "\nRun '%s %s -h' for its flags.\n", prog, upper)
	}
	if len(args) == 0 {
		fmt.Fprintf(stderr, "%s: name a %s\n", prog, noun)
		usage(stderr)
		return ExitUsage
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		usage(stdout)
		return ExitOK
	}
	for _, s := range subs {
		if s.Name == args[0] {
			return s.Run(ctx, args[1:], stdout, stderr)
		}
	}
	fmt.Fprintf(stderr, "%s: unknown %s %q\n", prog, noun, args[0])
	usage(stderr)
	return ExitUsage
}
