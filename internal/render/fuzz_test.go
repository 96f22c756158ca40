package render

import (
	"bytes"
	"testing"
)

// FuzzRender feeds arbitrary streams to Parse and Pin. Properties: nothing
// panics; with no record the output is the input, byte for byte (B2); and a
// pinned output is YAML with the same documents and managed containers,
// which pinning again leaves unchanged — so every splice landed exactly on
// the scalar the YAML parser saw (R7 makes the second pass a no-op).
func FuzzRender(f *testing.F) {
	f.Add(fixture(f, false))
	f.Add(fixture(f, true))
	cfg := loadConfig(f, "")
	f.Fuzz(func(t *testing.T, stream []byte) {
		s, err := Parse(stream, cfg, "tb")
		if err != nil {
			return
		}
		if res := s.Pin(map[ImageKey]string{}, nil); !bytes.Equal(res.Out, stream) {
			t.Fatalf("with no record the output differs from the input:\n%s", lineDiff(stream, res.Out))
		}
		res := s.Pin(web, nil)
		if len(res.Changes) == 0 {
			if !bytes.Equal(res.Out, stream) {
				t.Fatal("no change reported, but the output differs from the input")
			}
			return
		}
		s2, err := Parse(res.Out, cfg, "tb")
		if err != nil {
			t.Fatalf("the pinned stream is not YAML: %v\n%q", err, res.Out)
		}
		if s2.documents != s.documents || len(s2.sites) != len(s.sites) {
			t.Fatalf("pinning changed the structure: %d documents, %d containers -> %d, %d\n%q",
				s.documents, len(s.sites), s2.documents, len(s2.sites), res.Out)
		}
		for _, c := range res.Changes {
			found := false
			for _, st := range s2.sites {
				if st.node.Value == c.To {
					found = true
				}
			}
			if !found {
				t.Fatalf("change %+v: no managed container reads %q after the splice\n%q", c, c.To, res.Out)
			}
		}
		if again := s2.Pin(web, nil); !bytes.Equal(again.Out, res.Out) || len(again.Changes) != 0 {
			t.Fatalf("pinning twice changed the stream again: %+v\n%s", again.Changes, lineDiff(res.Out, again.Out))
		}
	})
}
