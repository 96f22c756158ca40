//go:build ignore

// localdb writes a Go vulnerability database (the v1 layout that
// `govulncheck -db file://DIR` reads: index/db.json, index/modules.json,
// index/vulns.json, ID/GO-….json and their .gz twins) from the OSV entries in
// the data/osv folder of the golang.org/x/vulndb module.
//
// It uses golang.org/x/vulndb/internal/database, which only code inside that
// module can import, so hack/vulncheck.sh copies this file into a copy of the
// module (without its data) and runs it there; the build tag keeps it out of
// this repository's own `go build ./...` and `go vet ./...`.
//
// RawLoad needs no git checkout (cmd/gendb of vulndb does, for timestamps);
// the entries' modified dates are then as the files have them, which
// govulncheck does not use for matching.
package main

import (
	"flag"
	"fmt"
	"os"

	"golang.org/x/vulndb/internal/database"
)

func main() {
	osvDir := flag.String("osv", "", "folder of OSV entries (data/osv of golang.org/x/vulndb)")
	out := flag.String("out", "", "folder to write the database into (must not exist)")
	flag.Parse()
	if *osvDir == "" || *out == "" {
		fmt.Fprintln(os.Stderr, "usage: localdb -osv DIR -out DIR")
		os.Exit(2)
	}
	db, err := database.RawLoad(*osvDir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "localdb:", err)
		os.Exit(1)
	}
	if err := db.Write(*out); err != nil {
		fmt.Fprintln(os.Stderr, "localdb:", err)
		os.Exit(1)
	}
	fmt.Fprintf(os.Stderr, "localdb: %d entries, %d modules\n", len(db.Entries), len(db.Modules))
}
