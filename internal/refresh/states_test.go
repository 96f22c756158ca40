package refresh

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestStates_ListsEveryStateConstant holds States to the package's State
// constants: a constant added without its entry fails here, so `status
// --help` and the docs' check of docs/states/ never miss a state.
func TestStates_ListsEveryStateConstant(t *testing.T) {
	fset := token.NewFileSet()
	entries, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	var consts []State
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, e.Name(), nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, decl := range f.Decls {
			gd, ok := decl.(*ast.GenDecl)
			if !ok || gd.Tok != token.CONST {
				continue
			}
			for _, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				if id, ok := vs.Type.(*ast.Ident); !ok || id.Name != "State" {
					continue
				}
				for _, v := range vs.Values {
					lit, ok := v.(*ast.BasicLit)
					if !ok {
						t.Fatalf("%s: a State constant that is not a string literal", fset.Position(v.Pos()))
					}
					s, err := strconv.Unquote(lit.Value)
					if err != nil {
						t.Fatal(err)
					}
					consts = append(consts, State(s))
				}
			}
		}
	}
	if len(consts) < 10 {
		t.Fatalf("found only %d State constants (%v); the scan is broken", len(consts), consts)
	}
	listed := States()
	for _, c := range consts {
		if !slices.Contains(listed, c) {
			t.Errorf("State %q is not in States()", c)
		}
	}
	if len(listed) != len(consts) {
		t.Errorf("States() has %d entries, the package %d State constants: %v vs %v", len(listed), len(consts), listed, consts)
	}
}
