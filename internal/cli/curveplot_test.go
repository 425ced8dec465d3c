package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvload-exporter/kvload-exporter/internal/testutil"
)

// TestPlotFormatFromExtension: --plot draws in the format its extension
// names, JPEG for .jpg, not SVG under another name.
func TestPlotFormatFromExtension(t *testing.T) {
	trace := writeTrace(t, testutil.AIPerfDocRows)
	for _, tt := range []struct {
		name  string
		magic string
	}{{"curve.jpg", "\xff\xd8\xff"}, {"curve.png", "\x89PNG"}, {"curve.svg", "<?xml"}, {"curve", "<?xml"}} {
		path := filepath.Join(t.TempDir(), tt.name)
		if code, _, stderr := runCLI("analyze", trace, "--capacity-curve", "--plot", path); code != exitOK {
			t.Fatalf("%s: exit %d: %s", tt.name, code, stderr)
		}
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(string(data), tt.magic) {
			t.Errorf("%s starts with %q, want %q", tt.name, data[:min(8, len(data))], tt.magic)
		}
	}
}
