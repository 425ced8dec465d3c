//go:build linux

package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// nobodyID is the conventional unprivileged user and group.
const nobodyID = 65534

// TestBadInputUnreadableAsRoot runs the unreadable-file cases when the
// suite runs as root (CI does), who reads any file whatever its mode: the
// test binary is re-executed as user nobody for just those cases, so that
// their golden errors are checked everywhere, not skipped.
func TestBadInputUnreadableAsRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("not root: TestBadInputCheck and TestBadInputStart run these cases themselves")
	}
	var names []string
	for _, c := range badInputCases() {
		if c.needsNonRoot {
			names = append(names, c.name)
		}
	}
	if len(names) == 0 {
		t.Fatal("no case needs a non-root user: this test has nothing to run")
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// The go test binary lives in a 0700 directory: copy it where nobody
	// can run it.
	dir, err := os.MkdirTemp("", "kvload-as-nobody-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "kvload-exporter.test")
	data, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	// The child's own temporary directories (t.TempDir) go in one it owns.
	tmp := filepath.Join(dir, "tmp")
	if err := os.Mkdir(tmp, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(tmp, nobodyID, nobodyID); err != nil {
		t.Fatal(err)
	}
	pattern := "^TestBadInput(Check|Start)$/^(" + strings.Join(names, "|") + ")$"
	cmd := exec.CommandContext(t.Context(), bin, "-test.run", pattern, "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), "HOME="+tmp, "TMPDIR="+tmp)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobodyID, Gid: nobodyID}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s as nobody: %v\n%s", pattern, err, out)
	}
	// Both tests must really have run every case (a pattern that matches
	// nothing passes too).
	for _, test := range []string{"TestBadInputCheck", "TestBadInputStart"} {
		for _, name := range names {
			if pass := "--- PASS: " + test + "/" + name + " "; !strings.Contains(string(out), pass) {
				t.Errorf("%s/%s did not pass as nobody:\n%s", test, name, out)
			}
		}
	}
}
