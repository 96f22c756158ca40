package workload

import (
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
)

// Settledness says whether a workload's last rollout finished (SPEC R4) and,
// if not, why — the reason goes into logs and `status`.
type Settledness struct {
	Settled bool
	Reason  string
	// Unobserved: the controller has not observed the current generation
	// yet. An annotation write bumps a Deployment's generation too; the
	// controller catches up within milliseconds (GetObserved waits for it,
	// and excuses the generations image-refresh's own annotation writes
	// caused).
	Unobserved                     bool
	ObservedGeneration, Generation int64
	// OwnBumps: the controller had not observed the current generation,
	// but only image-refresh's own annotation writes moved it; the status
	// decided.
	OwnBumps bool
	// Failed says why the rollout will not finish by itself, as the
	// workload's controller reports it: a Deployment past its
	// progressDeadlineSeconds (ProgressDeadlineExceeded). V2 rolls back
	// on it without waiting out rolloutTimeout.
	Failed string
	status *Settledness // what the status says, generation aside
}

// FailedReason is Failed, also of a status whose generation the
// controller has not observed yet.
func (s Settledness) FailedReason() string {
	if s.Failed == "" && s.status != nil {
		return s.status.Failed
	}
	return s.Failed
}

func unobserved(observed, generation int64, status Settledness) Settledness {
	return Settledness{Reason: fmt.Sprintf("observedGeneration %d < generation %d", observed, generation), Unobserved: true,
		ObservedGeneration: observed, Generation: generation, status: &status}
}

func notSettled(format string, args ...any) Settledness {
	return Settledness{Reason: fmt.Sprintf(format, args...)}
}

// DeploymentSettled: the controller observed the current generation, every
// replica runs the current template and is available, and no old replica
// is left (the same test as `kubectl rollout status`).
func DeploymentSettled(d *appsv1.Deployment) Settledness {
	if s := d.Status; s.ObservedGeneration < d.Generation {
		return unobserved(s.ObservedGeneration, d.Generation, deploymentStatus(d))
	}
	return deploymentStatus(d)
}

func deploymentStatus(d *appsv1.Deployment) Settledness {
	want := int32(1)
	if d.Spec.Replicas != nil {
		want = *d.Spec.Replicas
	}
	s := d.Status
	var st Settledness
	switch {
	case s.UpdatedReplicas < want:
		st = notSettled("%d of %d replicas updated", s.UpdatedReplicas, want)
	case s.Replicas > s.UpdatedReplicas:
		st = notSettled("%d old replicas pending termination", s.Replicas-s.UpdatedReplicas)
	case s.AvailableReplicas < want:
		st = notSettled("%d of %d updated replicas available", s.AvailableReplicas, want)
	default:
		return Settledness{Settled: true}
	}
	for _, c := range s.Conditions {
		if c.Type == appsv1.DeploymentProgressing && c.Status == "False" && c.Reason == "ProgressDeadlineExceeded" {
			st.Failed = "ProgressDeadlineExceeded: " + c.Message
		}
	}
	return st
}

// DaemonSetSettled: every scheduled pod is updated and available. A node
// that is NotReady but still counted in desiredNumberScheduled (tolerations
// Exists) keeps the DaemonSet unsettled — the seed's production case.
func DaemonSetSettled(ds *appsv1.DaemonSet) Settledness {
	if ds.Status.ObservedGeneration < ds.Generation {
		return unobserved(ds.Status.ObservedGeneration, ds.Generation, daemonSetStatus(ds))
	}
	return daemonSetStatus(ds)
}

func daemonSetStatus(ds *appsv1.DaemonSet) Settledness {
	s := ds.Status
	switch {
	case s.UpdatedNumberScheduled < s.DesiredNumberScheduled:
		return notSettled("%d of %d scheduled pods updated", s.UpdatedNumberScheduled, s.DesiredNumberScheduled)
	case s.NumberAvailable < s.DesiredNumberScheduled:
		return notSettled("%d of %d scheduled pods available", s.NumberAvailable, s.DesiredNumberScheduled)
	}
	return Settledness{Settled: true}
}

// StatefulSetSettled: every replica is on the update revision and ready.
func StatefulSetSettled(st *appsv1.StatefulSet) Settledness {
	if st.Status.ObservedGeneration < st.Generation {
		return unobserved(st.Status.ObservedGeneration, st.Generation, statefulSetStatus(st))
	}
	return statefulSetStatus(st)
}

func statefulSetStatus(st *appsv1.StatefulSet) Settledness {
	want := int32(1)
	if st.Spec.Replicas != nil {
		want = *st.Spec.Replicas
	}
	s := st.Status
	switch {
	case s.UpdatedReplicas < want && st.Spec.UpdateStrategy.Type != appsv1.OnDeleteStatefulSetStrategyType:
		return notSettled("%d of %d replicas updated", s.UpdatedReplicas, want)
	case s.ReadyReplicas < want:
		return notSettled("%d of %d replicas ready", s.ReadyReplicas, want)
	case s.AvailableReplicas < want:
		return notSettled("%d of %d replicas available", s.AvailableReplicas, want)
	case s.UpdateRevision != "" && s.CurrentRevision != s.UpdateRevision && st.Spec.UpdateStrategy.Type != appsv1.OnDeleteStatefulSetStrategyType:
		return notSettled("current revision %s is not the update revision %s", s.CurrentRevision, s.UpdateRevision)
	}
	return Settledness{Settled: true}
}

// CronJobSettled: a CronJob has no rollout. Its next Job is created from
// the template as stored, so the write is done once the API server stored
// it; Jobs already running keep the image they started with, as they would
// after any template change.
func CronJobSettled(*batchv1.CronJob) Settledness {
	return Settledness{Settled: true}
}
