// Package zones opens, for tests, the two time zone databases a process may
// tick by: Go's own ($GOROOT/lib/time/zoneinfo.zip, the data that
// "import _ time/tzdata" embeds in a binary) and the system's
// (/usr/share/zoneinfo). They differ: the system's files list every
// transition up to 2037, Go's list fewer and leave the rest to each zone's
// rule, so a fault in reading the rule shows in different years.
package zones

import (
	"archive/zip"
	"bytes"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
)

// A DB is one zone database.
type DB struct {
	Name  string   // "go" or "system"
	Zones []string // every zone name it holds, sorted
	data  map[string][]byte
}

// Load returns the zone named name from db.
func (db *DB) Load(name string) (*time.Location, error) {
	b, ok := db.data[name]
	if !ok {
		return nil, fmt.Errorf("zones: %s database: no zone %q", db.Name, name)
	}
	return time.LoadLocationFromTZData(name, b)
}

// Go opens Go's zone database.
func Go() (*DB, error) {
	root := runtime.GOROOT()
	if root == "" {
		out, err := exec.Command("go", "env", "GOROOT").Output()
		if err != nil {
			return nil, fmt.Errorf("zones: Go's database: go env GOROOT: %w", err)
		}
		root = strings.TrimSpace(string(out))
	}
	raw, err := os.ReadFile(filepath.Join(root, "lib", "time", "zoneinfo.zip"))
	if err != nil {
		return nil, fmt.Errorf("zones: Go's database: %w", err)
	}
	r, err := zip.NewReader(bytes.NewReader(raw), int64(len(raw)))
	if err != nil {
		return nil, fmt.Errorf("zones: Go's database: %w", err)
	}
	db := &DB{Name: "go", data: map[string][]byte{}}
	for _, f := range r.File {
		rc, err := f.Open()
		if err != nil {
			return nil, fmt.Errorf("zones: Go's database: %s: %w", f.Name, err)
		}
		b, err := io.ReadAll(rc)
		rc.Close()
		if err != nil {
			return nil, fmt.Errorf("zones: Go's database: %s: %w", f.Name, err)
		}
		db.add(f.Name, b)
	}
	return db, nil
}

// SystemDir is where the system's zone database lives on Debian.
const SystemDir = "/usr/share/zoneinfo"

// System opens the system's zone database, leaving out its copies with
// leap seconds (right/) and under other names (posix/).
func System() (*DB, error) {
	db := &DB{Name: "system", data: map[string][]byte{}}
	err := filepath.WalkDir(SystemDir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name, _ := filepath.Rel(SystemDir, path)
		switch {
		case d.IsDir() && (name == "right" || name == "posix"):
			return filepath.SkipDir
		case d.IsDir() || name == "localtime" || name == "posixrules" || name == "Factory":
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		db.add(name, b)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("zones: the system's database: %w", err)
	}
	if len(db.Zones) == 0 {
		return nil, fmt.Errorf("zones: the system's database: no zone in %s", SystemDir)
	}
	return db, nil
}

// add keeps b as the zone name when it is a zone file.
func (db *DB) add(name string, b []byte) {
	if !bytes.HasPrefix(b, []byte("TZif")) {
		return
	}
	db.data[name] = b
	i, _ := slices.BinarySearch(db.Zones, name)
	db.Zones = slices.Insert(db.Zones, i, name)
}

// Distinct returns one name of each zone db holds under several names
// (links such as US/Eastern for America/New_York), the first in order.
func (db *DB) Distinct() []string {
	seen := map[string]bool{}
	var out []string
	for _, name := range db.Zones {
		if b := string(db.data[name]); !seen[b] {
			seen[b] = true
			out = append(out, name)
		}
	}
	return out
}

// Both opens Go's database and the system's for a test. A missing system
// database skips the test, loudly, unless DQ_REQUIRE_REDIS=1 (CI, which
// installs every prerequisite) makes it fail.
func Both(tb testing.TB) []*DB {
	tb.Helper()
	g, err := Go()
	if err != nil {
		tb.Fatal(err)
	}
	s, err := System()
	if err != nil {
		if os.Getenv("DQ_REQUIRE_REDIS") == "1" {
			tb.Fatalf("%v (install Debian's package tzdata)", err)
		}
		tb.Skipf("SKIPPED: %v (install Debian's package tzdata)", err)
	}
	return []*DB{g, s}
}
