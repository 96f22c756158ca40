package config

import (
	"errors"
	"fmt"
	"regexp"
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
	// kinds are the kind names targets and anchors may use: the built-in
	// ones and the config's declared ones (K2).
	kinds []string
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
	v := &validator{lines: lines, failed: failed, kinds: c.KindNames()}
	prefix := c.AnnotationPrefix
	if !v.name("annotationPrefix", prefix, "DNS subdomain", validation.IsDNS1123Subdomain) {
		prefix = "" // do not also fail every image name on a bad prefix
	}
	v.positive("rolloutTimeout", c.RolloutTimeout)
	v.positive("registryTimeout", c.RegistryTimeout)
	v.positive("apiTimeout", c.APITimeout)
	v.positive("pinCheckInterval", c.PinCheckInterval)
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
	v.declaredKinds(c.Kinds)
	v.groups(c.Groups, prefix)
	v.promotionSigning(c)
	v.promotions(c.Groups, c)
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

func (v *validator) kind(path string, k string) bool {
	if k == "" {
		v.errorf(path, "missing")
		return false
	}
	if !slices.Contains(v.kinds, k) {
		v.errorf(path, "kind %q is not supported (want one of %s, or declare it under kinds:)", k, strings.Join(v.kinds, ", "))
		return false
	}
	return true
}

// kindName is the form of a Kind: an upper-case letter, then letters and
// digits (the API server's own rule for a CRD's kind is looser; this is
// the form every kind in use has).
var kindName = regexp.MustCompile(`^[A-Z][A-Za-z0-9]*$`)

// declaredKinds checks the kinds: declarations (K2). A declared kind is
// named by its Kind alone in targets and anchors, so it must not be a
// built-in kind's name nor declared twice.
func (v *validator) declaredKinds(kinds []DeclaredKind) {
	seen := map[string]int{}
	for i, k := range kinds {
		p := fmt.Sprintf("kinds[%d]", i)
		v.name(p+".group", k.Group, "API group (DNS-1123 subdomain)", validation.IsDNS1123Subdomain)
		v.name(p+".version", k.Version, "API version (DNS-1123 label)", validation.IsDNS1123Label)
		switch {
		case k.Kind == "":
			v.errorf(p+".kind", "missing")
		case !kindName.MatchString(k.Kind):
			v.errorf(p+".kind", "%q is not a kind name (an upper-case letter, then letters and digits: Rollout)", k.Kind)
		case SupportedKind(k.Kind):
			v.errorf(p+".kind", "%s is a built-in kind; declare only kinds beyond %s", k.Kind, strings.Join(KindNames(), ", "))
		default:
			if j, dup := seen[k.Kind]; dup {
				v.errorf(p+".kind", "%s is declared twice (also kinds[%d]); targets name a kind by its kind alone", k.Kind, j)
			}
			seen[k.Kind] = i
		}
		v.dottedPath(p+".podTemplate", k.PodTemplate, true)
		if k.Resource != "" {
			v.name(p+".resource", k.Resource, "resource name (DNS-1123 label, the plural: rollouts)", validation.IsDNS1123Label)
		}
		if k.Selector != "" && k.Selector != "-" {
			v.dottedPath(p+".selector", k.Selector, false)
		}
	}
}

// dottedPath checks a field path such as spec.template: segments of
// letters and digits, joined by dots.
func (v *validator) dottedPath(path, value string, required bool) {
	if value == "" {
		if required {
			v.errorf(path, "missing (the dotted path of the pod template: spec.template)")
		}
		return
	}
	for _, seg := range strings.Split(value, ".") {
		if !fieldName.MatchString(seg) {
			v.errorf(path, "%q is not a dotted field path (spec.template)", value)
			return
		}
	}
}

var fieldName = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_]*$`)

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
