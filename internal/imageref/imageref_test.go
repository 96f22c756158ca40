package imageref

import (
	"strings"
	"testing"
)

const hexA = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"

func TestParse_SplitsEveryForm(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Reference
	}{
		{"acme/api", Reference{Repository: "acme/api"}},
		{"acme/api:prod", Reference{Repository: "acme/api", Tag: "prod"}},
		{"127.0.0.1:5000/acme/api", Reference{Repository: "127.0.0.1:5000/acme/api"}},
		{"127.0.0.1:5000/acme/api:prod", Reference{Repository: "127.0.0.1:5000/acme/api", Tag: "prod"}},
		{"acme/api@sha256:" + hexA, Reference{Repository: "acme/api", Digest: "sha256:" + hexA}},
		{"mirror.local/acme/api:prod@sha256:" + hexA, Reference{Repository: "mirror.local/acme/api", Tag: "prod", Digest: "sha256:" + hexA}},
	} {
		got, err := Parse(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("Parse(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
		if got.String() != tc.in {
			t.Errorf("Parse(%q).String() = %q", tc.in, got.String())
		}
	}
}

func TestParse_R1_RejectsWhatMustNeverBePinned(t *testing.T) {
	for _, in := range []string{
		"", "Acme/api", "acme/api@sha256:abc", "acme/api@sha256:" + strings.ToUpper(hexA),
		"acme/api@latest", "acme/api:", "acme/api:-bad", "acme/api@md5:" + hexA,
	} {
		if _, err := Parse(in); err == nil {
			t.Errorf("Parse(%q) accepted an invalid reference", in)
		}
	}
}

func TestDigestOf_R7_ComparesOnlyTheDigestPart(t *testing.T) {
	d := "sha256:" + hexA
	for in, want := range map[string]string{
		"acme/api:prod":                         "",
		"acme/api@" + d:                         d,
		"mirror.local/acme/api:prod@" + d:       d,
		"127.0.0.1:5000/acme/api:prod@" + d:     d,
		"docker.io/acme/api:prod@sha256:abcdef": "sha256:abcdef",
	} {
		if got := DigestOf(in); got != want {
			t.Errorf("DigestOf(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestCanonicalRepository_R3_DockerHubSpellingsAreOneRepository(t *testing.T) {
	a, _ := CanonicalRepository("acme/api")
	b, _ := CanonicalRepository("docker.io/acme/api")
	c, _ := CanonicalRepository("index.docker.io/acme/api")
	m, _ := CanonicalRepository("mirror.local/acme/api")
	if a != b || b != c {
		t.Errorf("Docker Hub spellings differ: %q %q %q", a, b, c)
	}
	if a == m {
		t.Errorf("a mirror is the same repository as Docker Hub")
	}
}

func TestPin_FormatsTheConfiguredWay(t *testing.T) {
	d := "sha256:" + hexA
	if got := Pin("acme/api", "prod", d, PinTagAndDigest); got != "acme/api:prod@"+d {
		t.Errorf("tag+digest: %q", got)
	}
	if got := Pin("acme/api", "prod", d, PinDigest); got != "acme/api@"+d {
		t.Errorf("digest: %q", got)
	}
}

// FuzzParse: no input panics; whatever parses renders back to itself and
// parses again to the same value; a parsed digest is always valid (R1).
func FuzzParse(f *testing.F) {
	for _, s := range []string{"acme/api:prod", "127.0.0.1:5000/a/b:c@sha256:" + hexA, "a@sha256:x", "::", "@", "a:b:c/d", "x/y@sha512:" + hexA + hexA} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ref, err := Parse(s)
		if err != nil {
			return
		}
		if ref.String() != s {
			t.Fatalf("Parse(%q).String() = %q", s, ref.String())
		}
		again, err := Parse(ref.String())
		if err != nil || again != ref {
			t.Fatalf("re-parse of %q: %+v, %v", s, again, err)
		}
		if ref.Digest != "" {
			if _, err := ParseDigest(ref.Digest); err != nil {
				t.Fatalf("Parse(%q) kept an invalid digest %q", s, ref.Digest)
			}
		}
	})
}

func FuzzParseDigest(f *testing.F) {
	for _, s := range []string{"sha256:" + hexA, "sha256:", "sha256:ABC", ":", "sha512:" + hexA + hexA} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, err := ParseDigest(s)
		if err != nil {
			return
		}
		algo, hex, ok := strings.Cut(d, ":")
		if !ok || d != s || strings.Trim(hex, "0123456789abcdef") != "" || (algo == "sha256" && len(hex) != 64) {
			t.Fatalf("ParseDigest(%q) accepted %q", s, d)
		}
	})
}
