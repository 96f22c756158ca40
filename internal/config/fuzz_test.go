package config

import (
	"reflect"
	"testing"

	"go.yaml.in/yaml/v3"
)

// FuzzParse checks that Parse never panics, returns exactly one of a Config
// and an error, and that a returned Config is valid and survives a round trip
// through YAML unchanged. The seed corpus is in testdata/fuzz/FuzzParse.
func FuzzParse(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse(data, "fuzz.yaml")
		if (c == nil) == (err == nil) {
			t.Fatalf("Parse returned config %v and error %v", c, err)
		}
		if c == nil {
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("Parse returned a config that fails Validate: %v", err)
		}
		out, err := yaml.Marshal(c)
		if err != nil {
			t.Fatalf("marshal: %v", err)
		}
		again, err := Parse(out, "round-trip.yaml")
		if err != nil {
			t.Fatalf("a parsed config does not parse again: %v\n%s", err, out)
		}
		if !reflect.DeepEqual(again, c) {
			t.Fatalf("round trip changed the config\n got: %+v\nwant: %+v", again, c)
		}
	})
}
