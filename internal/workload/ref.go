package workload

import (
	"fmt"
	"strings"

	"github.com/image-refresh/image-refresh/internal/config"
)

// UnsupportedKind is the error for a kind that is not in the table; it
// lists the supported ones.
func UnsupportedKind(kind string) error {
	return fmt.Errorf("%w %q (want one of %s)", ErrUnsupportedKind, kind, strings.Join(KindNames(), ", "))
}

// validate checks that ref, the config's name of one workload, names a kind
// of the table, a namespace and a name.
func validate(ref config.Workload) error {
	if _, ok := LookupKind(ref.Kind); !ok {
		return fmt.Errorf("%s: %w", ref, UnsupportedKind(ref.Kind))
	}
	if ref.Namespace == "" || ref.Name == "" {
		return fmt.Errorf("workload %q: namespace and name are required", ref)
	}
	return nil
}
