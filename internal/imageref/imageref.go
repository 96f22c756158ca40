// Package imageref parses the image references found in pod templates and
// builds the pinned references image-refresh writes. It is pure: no I/O.
package imageref

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// Reference is an image reference split into its parts, as written in a pod
// template: "repo", "repo:tag", "repo@digest" or "repo:tag@digest".
type Reference struct {
	// Repository as written (not normalised), e.g. "acme/api" or
	// "127.0.0.1:5000/acme/api".
	Repository string
	Tag        string
	// Digest is the text after '@', validated ("sha256:<64 lowercase hex>").
	Digest string
}

// tagPattern is the distribution spec's tag grammar; the kubelet refuses
// anything else.
var tagPattern = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$`)

// Parse splits and validates an image reference.
func Parse(s string) (Reference, error) {
	if s == "" {
		return Reference{}, fmt.Errorf("image reference is empty")
	}
	var ref Reference
	rest := s
	if i := strings.LastIndexByte(rest, '@'); i >= 0 {
		d, err := ParseDigest(rest[i+1:])
		if err != nil {
			return Reference{}, fmt.Errorf("image reference %q: %w", s, err)
		}
		ref.Digest = d
		rest = rest[:i]
	}
	// A ':' after the last '/' separates the tag; one before it is a port.
	if i := strings.LastIndexByte(rest, ':'); i > strings.LastIndexByte(rest, '/') {
		ref.Tag = rest[i+1:]
		rest = rest[:i]
		if !tagPattern.MatchString(ref.Tag) {
			return Reference{}, fmt.Errorf("image reference %q: tag %q does not match %s", s, ref.Tag, tagPattern)
		}
	}
	if _, err := name.NewRepository(rest); err != nil {
		return Reference{}, fmt.Errorf("image reference %q: repository %q: %w", s, rest, err)
	}
	if ref.Tag != "" {
		if _, err := name.NewTag(rest + ":" + ref.Tag); err != nil {
			return Reference{}, fmt.Errorf("image reference %q: tag %q: %w", s, ref.Tag, err)
		}
	}
	ref.Repository = rest
	return ref, nil
}

// String renders the reference back to text.
func (r Reference) String() string {
	s := r.Repository
	if r.Tag != "" {
		s += ":" + r.Tag
	}
	if r.Digest != "" {
		s += "@" + r.Digest
	}
	return s
}

// ParseDigest validates a digest ("algorithm:hex"; sha256 is 64 lowercase
// hex digits) and returns it unchanged. Anything else is an error and must
// never be pinned (R1).
func ParseDigest(s string) (string, error) {
	h, err := v1.NewHash(s)
	if err != nil {
		return "", fmt.Errorf("invalid digest %q: %w", s, err)
	}
	return h.String(), nil
}

// DigestOf returns the text after the last '@' of an image reference, or ""
// when it has none. R7 compares only this part, so that a webhook that
// rewrites the registry prefix is not mistaken for a revert.
func DigestOf(s string) string {
	if i := strings.LastIndexByte(s, '@'); i >= 0 {
		return s[i+1:]
	}
	return ""
}

// CanonicalRepository normalises a repository name so that "acme/api",
// "docker.io/acme/api" and "index.docker.io/acme/api" compare equal.
func CanonicalRepository(repo string) (string, error) {
	r, err := name.NewRepository(repo)
	if err != nil {
		return "", fmt.Errorf("repository %q: %w", repo, err)
	}
	return r.Name(), nil
}

// Registry returns the registry host that serves repo ("index.docker.io" for
// Docker Hub names).
func Registry(repo string) (string, error) {
	r, err := name.NewRepository(repo)
	if err != nil {
		return "", fmt.Errorf("repository %q: %w", repo, err)
	}
	return r.RegistryStr(), nil
}

// PinFormat says how a pinned reference is written.
type PinFormat string

const (
	// PinTagAndDigest writes "repo:tag@sha256:…": the tag stays readable.
	PinTagAndDigest PinFormat = "tag+digest"
	// PinDigest writes "repo@sha256:…".
	PinDigest PinFormat = "digest"
)

// Pin builds the reference that pins repo (as written in the target) to
// digest, keeping tag readable when the format asks for it.
func Pin(repo, tag, digest string, format PinFormat) string {
	if format == PinTagAndDigest && tag != "" {
		return repo + ":" + tag + "@" + digest
	}
	return repo + "@" + digest
}
