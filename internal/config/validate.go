package config

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/image-refresh/image-refresh/internal/imageref"
)

// Validate reports every problem in c, joined with errors.Join; each one is
// a *FieldError. It does not apply defaults, and it cannot check that a
// caFile or a public key file is readable (Load does).
func (c *Config) Validate() error {
	if c == nil {
		return errors.New("config is nil")
	}
	return errors.Join(c.validate(nil, nil)...)
}

// validator checks a Config. lines and failed come from the decoder (both
// nil for a Config built in code): lines puts a line on each message, failed
// silences the checks inside a field already reported as undecodable.
type validator struct {
	problems
	lines  map[string]int
	failed map[string]bool
}

func (v *validator) errorf(path, format string, args ...any) {
	for p := path; p != ""; p = parent(p) {
		if v.failed[p] {
			return // the field or one around it did not decode: said already
		}
	}
	v.add(path, lineOf(v.lines, path), fmt.Sprintf(format, args...))
}

func (c *Config) validate(lines map[string]int, failed map[string]bool) []error {
	v := &validator{lines: lines, failed: failed}
	prefix := c.AnnotationPrefix
	if !v.name("annotationPrefix", prefix, "DNS subdomain", validation.IsDNS1123Subdomain) {
		prefix = "" // do not also fail every image name on a bad prefix
	}
	v.positive("rolloutTimeout", c.RolloutTimeout)
	v.positive("registryTimeout", c.RegistryTimeout)
	v.positive("apiTimeout", c.APITimeout)
	if c.TickTimeout < 0 {
		v.errorf("tickTimeout", "must not be negative, got %s (0 derives it from rolloutTimeout)", c.TickTimeout)
	}
	v.atLeastOne("maxRefreshAttempts", c.MaxRefreshAttempts)
	v.atLeastOne("maxSkipTicks", c.MaxSkipTicks)
	v.atLeastOne("maxReadFailures", c.MaxReadFailures)
	v.atLeastOne("maxDigestChanges", c.MaxDigestChanges)
	if c.DigestChangeWindow < 0 {
		v.errorf("digestChangeWindow", "must not be negative, got %s (0 turns the bound off)", c.DigestChangeWindow)
	}
	if c.MinDigestAge < 0 {
		v.errorf("minDigestAge", "must not be negative, got %s (0 rolls a new digest at once)", c.MinDigestAge)
	}
	if c.MaxConcurrentRollouts < 0 {
		v.errorf("maxConcurrentRollouts", "must not be negative, got %d (0 is unlimited)", c.MaxConcurrentRollouts)
	}
	for i, w := range c.RolloutWindows {
		v.window(fmt.Sprintf("rolloutWindows[%d]", i), w)
	}
	v.oneOf("firstInstall", string(c.FirstInstall),
		string(FirstInstallPinNextTick), string(FirstInstallOnlyAfterEverPinned))
	v.oneOf("pinFormat", string(c.PinFormat),
		string(imageref.PinTagAndDigest), string(imageref.PinDigest))
	v.registries(c.Registries)
	v.verification(c.Verification)
	v.groups(c.Groups, prefix)
	return v.errs
}

func (v *validator) positive(path string, d time.Duration) {
	if d <= 0 {
		v.errorf(path, "must be positive, got %s", d)
	}
}

func (v *validator) atLeastOne(path string, n int) {
	if n < 1 {
		v.errorf(path, "must be at least 1, got %d", n)
	}
}

func (v *validator) oneOf(path, value string, allowed ...string) {
	if !slices.Contains(allowed, value) {
		v.errorf(path, "%q is not one of %s", value, strings.Join(allowed, ", "))
	}
}

// name checks a required name with one of the Kubernetes validators.
func (v *validator) name(path, value, what string, check func(string) []string) bool {
	if value == "" {
		v.errorf(path, "missing")
		return false
	}
	if msgs := check(value); len(msgs) > 0 {
		v.errorf(path, "%q is not a valid %s: %s", value, what, strings.Join(msgs, "; "))
		return false
	}
	return true
}

func (v *validator) kind(path string, k Kind) bool {
	if k == "" {
		v.errorf(path, "missing")
		return false
	}
	if !SupportedKind(k) {
		v.errorf(path, "kind %q is not supported (want one of %s)", k, strings.Join(KindNames(), ", "))
		return false
	}
	return true
}

func (v *validator) workload(path string, w Workload) bool {
	ok := v.kind(path+".kind", w.Kind)
	ok = v.name(path+".namespace", w.Namespace, "namespace (DNS-1123 label)", validation.IsDNS1123Label) && ok
	ok = v.name(path+".name", w.Name, "object name (DNS-1123 subdomain)", validation.IsDNS1123Subdomain) && ok
	return ok
}

func (v *validator) registries(regs []Registry) {
	hosts := map[string]int{}
	for i, r := range regs {
		p := fmt.Sprintf("registries[%d].host", i)
		if r.Host == "" {
			v.errorf(p, "missing")
			continue
		}
		h, ok := canonicalHost(r.Host)
		if !ok {
			v.errorf(p, "%q is not a registry host as an image reference names it "+
				`(host[:port] with a dot, a port or "localhost", e.g. "registry.example.com" or "127.0.0.1:5000")`, r.Host)
			continue
		}
		if j, dup := hosts[h]; dup {
			v.errorf(p, "duplicate registry host %q (same registry as registries[%d])", r.Host, j)
			continue
		}
		hosts[h] = i
	}
}

// canonicalHost returns host as an image reference names its registry
// ("docker.io" becomes "index.docker.io"). A bare word is refused: in an
// image reference it reads as a Docker Hub namespace, so it would never match.
func canonicalHost(host string) (string, bool) {
	if host == "" || strings.ContainsAny(host, "/@ \t\r\n") ||
		(!strings.ContainsAny(host, ".:") && host != "localhost") {
		return "", false
	}
	reg, err := imageref.Registry(host + "/probe")
	if err != nil {
		return "", false
	}
	return strings.ToLower(reg), true
}
