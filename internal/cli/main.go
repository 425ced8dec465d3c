// Package cli is the kvload-exporter program: its commands, their flags,
// logging and web endpoints. cmd/kvload-exporter calls Main; the
// whole-program tests (internal/e2e, internal/shipping) call Run and Main
// in their own test binaries, which package main cannot be imported into.
//
// The program replays LLM request traces against inference servers and
// exports what it measures as Prometheus metrics. It also holds the
// offline trace tools: analyze, synthesize and hash.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/signal"
	"syscall"

	"github.com/alecthomas/kingpin/v2"
	"github.com/prometheus/common/version"

	"github.com/kvload-exporter/kvload-exporter/trace"
)

const programName = "kvload-exporter"

// Exit codes of the contract.
const (
	exitOK       = 0
	exitFailure  = 1
	exitBadInput = 2
)

// The exit codes under their exported names, for the whole-program tests
// that hold the README to them.
const (
	ExitOK       = exitOK
	ExitFailure  = exitFailure
	ExitBadInput = exitBadInput
)

// ProgramName is the name the program gives itself in usage and errors.
const ProgramName = programName

// streams are where a command writes; tests pass buffers.
type streams struct {
	stdout io.Writer
	stderr io.Writer
}

// command is one kingpin sub-command and what runs it.
type command struct {
	clause *kingpin.CmdClause
	run    func(ctx context.Context, s streams) error
}

// Main runs the program on os.Args and exits with its exit code; it stops
// on SIGINT and SIGTERM.
func Main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], streams{stdout: os.Stdout, stderr: os.Stderr})
	stop()
	os.Exit(code)
}

// usageTemplate is kingpin's, with the flags of the default command (the
// daemon's: --config.file, --web.listen-address...) under the program's
// own help, where a user looks for them first.
var usageTemplate = kingpin.DefaultUsageTemplate + `{{if not .Context.SelectedCommand -}}
{{range .App.Commands}}{{if .Default -}}
Flags of {{.Name}}, the default command ({{$.App.Name}} [{{.Name}}] [<flags>]):
{{.Flags|FlagsToTwoColumns|FormatTwoColumns}}
{{end}}{{end -}}
{{end -}}
`

// Run parses args (without the program's name), runs the chosen command
// writing to stdout and stderr, and returns the exit code.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return run(ctx, args, streams{stdout: stdout, stderr: stderr})
}

// terminated is raised through kingpin when --help or --version finish, so
// that run can return instead of the process exiting inside a library.
type terminated struct{ code int }

// run parses args, runs the chosen command and returns the exit code.
func run(ctx context.Context, args []string, s streams) (code int) {
	app := kingpin.New(programName, "A Prometheus exporter that replays LLM request traces and measures latency and prefix-cache hits, with offline trace tools.")
	app.Version(version.Print(programName))
	app.HelpFlag.Short('h')
	app.UsageTemplate(usageTemplate)
	app.UsageWriter(s.stdout)
	app.ErrorWriter(s.stderr)
	app.Terminate(func(c int) { panic(terminated{c}) })
	defer func() {
		if r := recover(); r != nil {
			t, ok := r.(terminated)
			if !ok {
				panic(r)
			}
			code = t.code
		}
	}()

	commands := []command{
		runCommand(app),
		analyzeCommand(app),
		analyzeTraceCommand(app),
		profileCommand(app),
		synthesizeCommand(app),
		hashCommand(app),
		emulateCommand(app),
	}
	chosen, err := app.Parse(args)
	if err != nil {
		fmt.Fprintf(s.stderr, "%s: error: %v, try --help\n", programName, err)
		return exitBadInput
	}
	for _, c := range commands {
		if c.clause.FullCommand() == chosen {
			if err := c.run(ctx, s); err != nil {
				fmt.Fprintf(s.stderr, "%s: %v\n", programName, err)
				return exitCode(err)
			}
			return exitOK
		}
	}
	app.Usage(args)
	return exitBadInput
}

// badInputError marks an error caused by what the user gave (a flag, a
// file), as opposed to a failure while working.
type badInputError struct{ err error }

func (e badInputError) Error() string { return e.err.Error() }
func (e badInputError) Unwrap() error { return e.err }

func badInput(err error) error { return badInputError{err} }

// codedError carries the exit code a command wants for its error.
type codedError struct {
	err  error
	code int
}

func (e codedError) Error() string { return e.err.Error() }
func (e codedError) Unwrap() error { return e.err }

func withExitCode(err error, code int) error { return codedError{err, code} }

func exitCode(err error) int {
	var bad badInputError
	var line *trace.LineError
	var coded codedError
	switch {
	case errors.As(err, &coded):
		return coded.code
	case errors.As(err, &bad), errors.As(err, &line),
		errors.Is(err, fs.ErrNotExist), errors.Is(err, fs.ErrPermission),
		errors.Is(err, syscall.EISDIR), // a directory given for a file
		errors.Is(err, trace.ErrEmpty):
		return exitBadInput
	default:
		return exitFailure
	}
}
