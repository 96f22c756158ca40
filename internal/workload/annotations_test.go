package workload_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/image-refresh/image-refresh/internal/config"
	"github.com/image-refresh/image-refresh/internal/workload"
	"github.com/image-refresh/image-refresh/test/support/testenv"
)

const (
	attemptKey = "tracebloc.io/refresh-attempt"
	flapKey    = "tracebloc.io/refresh-flap-detected"
	recordKey  = "tracebloc.io/last-refreshed-app-digest"
)

var anchorAnnotations = map[string]string{attemptKey: "1", flapKey: "3"}

func TestUpdateAnnotations_SetsAndDeletesOnEachKind(t *testing.T) {
	t.Parallel()
	c, wc, ns := setup(t)
	testenv.Deployment(t, c.Client, ns, "api", testenv.WithAnnotations(anchorAnnotations))
	testenv.DaemonSet(t, c.Client, ns, "agent", testenv.WithAnnotations(anchorAnnotations))
	testenv.StatefulSet(t, c.Client, ns, "db", testenv.WithAnnotations(anchorAnnotations))
	for _, ref := range []config.Workload{
		{Kind: "Deployment", Namespace: ns, Name: "api"},
		{Kind: "DaemonSet", Namespace: ns, Name: "agent"},
		{Kind: "StatefulSet", Namespace: ns, Name: "db"},
	} {
		t.Run(ref.Kind, func(t *testing.T) {
			before := mustGet(t, wc, ref)
			out, err := wc.UpdateAnnotations(context.Background(), ref,
				map[string]*string{attemptKey: ptr("1"), recordKey: nil},
				map[string]*string{attemptKey: nil, flapKey: nil, recordKey: ptr(digestA)})
			if err != nil {
				t.Fatal(err)
			}
			mine := func(a map[string]string) map[string]string {
				return map[string]string{attemptKey: a[attemptKey], flapKey: a[flapKey], recordKey: a[recordKey]}
			}
			want := map[string]string{attemptKey: "", flapKey: "", recordKey: digestA}
			if got := mine(out.Annotations); !maps.Equal(got, want) {
				t.Errorf("returned annotations %v, want %v", got, want)
			}
			live := mustGet(t, wc, ref)
			if got := mine(live.Annotations); !maps.Equal(got, want) {
				t.Errorf("live annotations %v, want %v", got, want)
			}
			if _, ok := live.Annotations[flapKey]; ok {
				t.Errorf("%s not deleted", flapKey)
			}
			// Controllers keep their own annotations; ours must not touch them.
			for k, v := range before.Annotations {
				if _, ours := want[k]; !ours && live.Annotations[k] != v {
					t.Errorf("annotation %s: %q → %q", k, v, live.Annotations[k])
				}
			}
			if !slices.Equal(live.Containers, before.Containers) {
				t.Errorf("containers %v → %v", before.Containers, live.Containers)
			}
		})
	}
}

func TestUpdateAnnotations_WritesNothingWhenExpectDiffersOrNothingToSet(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name    string
		expect  map[string]*string
		set     map[string]*string
		wantErr bool
	}{
		{"a key holds another value than the caller read", map[string]*string{attemptKey: ptr("2")}, map[string]*string{attemptKey: ptr("3")}, true},
		{"a key the caller read as absent is present", map[string]*string{flapKey: nil}, map[string]*string{flapKey: ptr("5")}, true},
		{"a key the caller read is gone", map[string]*string{recordKey: ptr(digestA)}, map[string]*string{recordKey: ptr(digestB)}, true},
		{"there is nothing to set", map[string]*string{attemptKey: ptr("1")}, nil, false},
		{"every value is already set", nil, map[string]*string{attemptKey: ptr("1"), recordKey: nil}, false},
	}
	c, wc, ns := setup(t)
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			name := fmt.Sprintf("anchor-%d", i)
			testenv.Deployment(t, c.Client, ns, name, testenv.WithAnnotations(anchorAnnotations))
			ref := config.Workload{Kind: "Deployment", Namespace: ns, Name: name}
			settle(t, c, ref) // the controllers' own writes are done
			before := mustGet(t, wc, ref)
			_, err := wc.UpdateAnnotations(context.Background(), ref, tc.expect, tc.set)
			if tc.wantErr != errors.Is(err, workload.ErrChanged) || (!tc.wantErr && err != nil) {
				t.Errorf("error %v, want ErrChanged: %v", err, tc.wantErr)
			}
			after := mustGet(t, wc, ref)
			if after.ResourceVersion != before.ResourceVersion || !maps.Equal(after.Annotations, before.Annotations) {
				t.Errorf("written: resourceVersion %s → %s, annotations %v", before.ResourceVersion, after.ResourceVersion, after.Annotations)
			}
		})
	}
}

// Two instances that read the same state and both try to bump the attempt
// counter: exactly one may win (C3, R10), through the public API and from
// one shared snapshot (where both patches carry the same resourceVersion).
func TestUpdateAnnotations_C3_OneOfTwoWritersFromTheSameReadWins(t *testing.T) {
	t.Parallel()
	c, wc, ns := setup(t)
	testenv.Deployment(t, c.Client, ns, "api", testenv.WithAnnotations(anchorAnnotations))
	ref := config.Workload{Kind: "Deployment", Namespace: ns, Name: "api"}
	ctx := context.Background()
	ways := map[string]func(obj *workload.Object, expect, set map[string]*string) error{
		"UpdateAnnotations": func(_ *workload.Object, expect, set map[string]*string) error {
			_, err := wc.UpdateAnnotations(ctx, ref, expect, set)
			return err
		},
		"from one snapshot": func(obj *workload.Object, expect, set map[string]*string) error {
			_, err := workload.UpdateAnnotationsFrom(wc, ctx, obj, expect, set)
			return err
		},
	}
	for way, update := range ways {
		for round := range 3 {
			obj := mustGet(t, wc, ref)
			read := obj.Annotations[attemptKey]
			errs := make([]error, 2)
			var wg sync.WaitGroup
			for i := range errs {
				wg.Go(func() {
					errs[i] = update(obj, map[string]*string{attemptKey: ptr(read)}, map[string]*string{attemptKey: ptr(fmt.Sprintf("%s+%d", read, i))})
				})
			}
			wg.Wait()
			won := -1
			for i, err := range errs {
				switch {
				case err == nil && won < 0:
					won = i
				case err == nil:
					t.Errorf("%s round %d: both writers succeeded", way, round)
				case !errors.Is(err, workload.ErrChanged):
					t.Errorf("%s round %d: loser's error %v, want ErrChanged", way, round, err)
				}
			}
			if won < 0 {
				t.Fatalf("%s round %d: no writer succeeded: %v", way, round, errs)
			}
			if got, want := mustGet(t, wc, ref).Annotations[attemptKey], fmt.Sprintf("%s+%d", read, won); got != want {
				t.Errorf("%s round %d: live value %q, want the winner's %q", way, round, got, want)
			}
		}
	}
}

// A conflict caused by an unrelated write is not a lost race: the
// compare-and-swap re-reads, finds its expectation still true, and retries.
func TestUpdateAnnotations_RetriesAConflictFromAnUnrelatedWrite(t *testing.T) {
	t.Parallel()
	c, wc, ns := setup(t)
	testenv.Deployment(t, c.Client, ns, "api", testenv.WithAnnotations(anchorAnnotations))
	ref := config.Workload{Kind: "Deployment", Namespace: ns, Name: "api"}
	stale := mustGet(t, wc, ref)
	other := []byte(`{"metadata":{"annotations":{"example.com/owner":"team-a"}}}`)
	if _, err := c.Client.AppsV1().Deployments(ns).Patch(context.Background(), "api", types.MergePatchType, other, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	out, err := workload.UpdateAnnotationsFrom(wc, context.Background(), stale, map[string]*string{attemptKey: ptr("1")}, map[string]*string{attemptKey: ptr("2")})
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]string{attemptKey: "2", flapKey: "3", "example.com/owner": "team-a"} {
		if out.Annotations[k] != v {
			t.Errorf("annotation %s = %q, want %q", k, out.Annotations[k], v)
		}
	}
}

// R4, R9: an annotation write bumps a Deployment's generation, so a read
// right after it finds the controller behind (observedGeneration <
// generation). GetObserved waits the milliseconds the controller needs, so
// that the pass after image-refresh's own write does not take the group for
// unsettled and write a skip streak it must clear again.
func TestGetObserved_R4_AReadRightAfterAnAnnotationWriteIsSettled(t *testing.T) {
	t.Parallel()
	c, wc, ns := setup(t)
	testenv.Deployment(t, c.Client, ns, "api", testenv.WithReplicas(1))
	ref := config.Workload{Kind: "Deployment", Namespace: ns, Name: "api"}
	ctx := context.Background()
	if st, err := wc.WaitSettled(ctx, ref, 30*time.Second); err != nil || !st.Settled {
		t.Fatalf("setup: %v %+v", err, st)
	}
	lagged := 0
	for i := range 20 {
		if _, err := wc.UpdateAnnotations(ctx, ref, nil, map[string]*string{attemptKey: ptr(fmt.Sprint(i + 1))}); err != nil {
			t.Fatal(err)
		}
		if i%2 == 0 { // a plain read, to show what GetObserved waits out
			if mustGet(t, wc, ref).Settled.Unobserved {
				lagged++
			}
			continue
		}
		obj, err := wc.GetObserved(ctx, ref)
		if err != nil {
			t.Fatal(err)
		}
		if !obj.Settled.Settled {
			t.Errorf("write %d: read as %q right after an annotation write", i+1, obj.Settled.Reason)
		}
		if obj.Annotations[attemptKey] != fmt.Sprint(i+1) {
			t.Errorf("write %d: read an older version (attempt %q)", i+1, obj.Annotations[attemptKey])
		}
	}
	t.Logf("a plain read right after an annotation write found the controller behind %d of 10 times", lagged)
}
