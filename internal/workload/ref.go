package workload

import (
	"fmt"
	"strings"
)

// Ref names one workload for the client. The config's groups name theirs
// with config.Workload, which converts to it: workload.Ref(w).
type Ref struct {
	Kind      string `yaml:"kind"`
	Namespace string `yaml:"namespace"`
	Name      string `yaml:"name"`
}

// String gives "Deployment tb/api", the form used in logs and errors.
func (r Ref) String() string {
	return fmt.Sprintf("%s %s/%s", r.Kind, r.Namespace, r.Name)
}

// UnsupportedKind is the error for a kind that is not in the table; it
// lists the supported ones.
func UnsupportedKind(kind string) error {
	return fmt.Errorf("%w %q (want one of %s)", ErrUnsupportedKind, kind, strings.Join(KindNames(), ", "))
}

func (r Ref) validate() error {
	if _, ok := LookupKind(r.Kind); !ok {
		return fmt.Errorf("%s: %w", r, UnsupportedKind(r.Kind))
	}
	if r.Namespace == "" || r.Name == "" {
		return fmt.Errorf("workload %q: namespace and name are required", r)
	}
	return nil
}
