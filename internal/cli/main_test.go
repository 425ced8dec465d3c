package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvload-exporter/kvload-exporter/internal/testutil"
)

// TestHelpShowsTheDaemonsFlags: the program's own --help lists the flags
// of run, the default command, where a new user looks for them.
func TestHelpShowsTheDaemonsFlags(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"-h"}, {"help"}} {
		code, stdout, _ := runCLI(args...)
		if code != exitOK {
			t.Errorf("%v: exit %d", args, code)
		}
		for _, want := range []string{"--config.file", "--web.listen-address", "--config.check", "profile"} {
			if !strings.Contains(stdout, want) {
				t.Errorf("%v does not show %s:\n%s", args, want, stdout)
			}
		}
	}
	// A command's own help keeps to its flags.
	if _, stdout, _ := runCLI("analyze", "--help"); strings.Contains(stdout, "--config.file") {
		t.Errorf("analyze --help shows the daemon's flags:\n%s", stdout)
	}
}

// TestUsageErrorsExit2: a usage error exits 2, whatever the command: a
// directory for a trace, an image format --plot cannot draw.
func TestUsageErrorsExit2(t *testing.T) {
	dir := t.TempDir()
	trace := writeTrace(t, testutil.AIPerfDocRows)
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"analyze", dir}, "is a directory"},
		{[]string{"analyze-trace", dir}, "is a directory"},
		{[]string{"analyze", trace, "--capacity-curve", "--plot", filepath.Join(dir, "x.gif")}, "--plot " + filepath.Join(dir, "x.gif") + ": .gif is not an image format"},
	} {
		if code, _, stderr := runCLI(tt.args...); code != exitBadInput || !strings.Contains(stderr, tt.want) {
			t.Errorf("%v: exit %d, stderr %q; want 2 and %q", tt.args, code, stderr, tt.want)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "x.gif")); err == nil {
		t.Error("a refused plot was written")
	}
}
