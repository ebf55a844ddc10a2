package pgtest

import (
	"context"
	"regexp"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

func TestMain(m *testing.M) { Run(m) }

func TestDBName(t *testing.T) {
	valid := regexp.MustCompile(`^[a-z0-9_]{1,63}$`)
	for _, test := range []string{"TestX", "TestX/sub-test #01", strings.Repeat("TestLong/", 20), "Tést"} {
		a, b := dbName(test), dbName(test)
		if !valid.MatchString(a) {
			t.Errorf("dbName(%q) = %q: want at most 63 of [a-z0-9_]", test, a)
		}
		if a == b {
			t.Errorf("dbName(%q) twice: both %q, want different names", test, a)
		}
	}
}

func TestDatabaseGivesEachCallItsOwnDatabase(t *testing.T) {
	ctx := context.Background()
	names := map[string]bool{}
	for range 2 {
		conn, err := pgx.Connect(ctx, Database(t))
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = conn.Close(ctx) }()
		var name string
		if err := conn.QueryRow(ctx, `SELECT current_database()`).Scan(&name); err != nil {
			t.Fatal(err)
		}
		// Fresh: no tables of a test before.
		var tables int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE schemaname = 'public'`).Scan(&tables); err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Exec(ctx, `CREATE TABLE t (x int)`); err != nil {
			t.Fatal(err)
		}
		if tables != 0 || names[name] {
			t.Fatalf("database %s: %d tables, seen before %v; want a new, empty database", name, tables, names[name])
		}
		names[name] = true
	}
}
