package workload

import "fmt"

// The workload kinds image-refresh manages, all apps/v1.
const (
	KindDeployment  = "Deployment"
	KindDaemonSet   = "DaemonSet"
	KindStatefulSet = "StatefulSet"
)

// apiVersion is the group/version of every supported kind.
const apiVersion = "apps/v1"

// Ref names one workload.
type Ref struct {
	Kind, Namespace, Name string
}

// String gives "Deployment tb/api", the form used in logs and errors.
func (r Ref) String() string {
	return fmt.Sprintf("%s %s/%s", r.Kind, r.Namespace, r.Name)
}

func (r Ref) validate() error {
	switch r.Kind {
	case KindDeployment, KindDaemonSet, KindStatefulSet:
	default:
		return fmt.Errorf("%w %q in %s (want %s, %s or %s)", ErrUnsupportedKind, r.Kind, r, KindDeployment, KindDaemonSet, KindStatefulSet)
	}
	if r.Namespace == "" || r.Name == "" {
		return fmt.Errorf("workload %q: namespace and name are required", r)
	}
	return nil
}
