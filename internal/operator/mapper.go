package operator

import (
	"net/http"
	"strings"
	"sync"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
)

// rememberingMapper answers RESTMapping from memory once the mapper it
// wraps answered it. The manager's cache of several namespaces asks the
// mapper whether the object is namespaced on every Get and List; the
// dynamic mapper builds its answer anew each time, which was a quarter of
// a resync's CPU at 10,000 workloads (C6). The kinds `run` maps are built
// in (workloads, pods, secrets, service accounts, events, leases), whose
// mappings do not change while the process runs. Errors are not kept: a
// kind not served yet is asked again.
type rememberingMapper struct {
	meta.RESTMapper
	mu    sync.RWMutex
	known map[string]meta.RESTMapping
}

func newRememberingMapper(m meta.RESTMapper) *rememberingMapper {
	return &rememberingMapper{RESTMapper: m, known: map[string]meta.RESTMapping{}}
}

// RESTMapping implements meta.RESTMapper.
func (m *rememberingMapper) RESTMapping(gk schema.GroupKind, versions ...string) (*meta.RESTMapping, error) {
	key := gk.String() + "/" + strings.Join(versions, ",")
	m.mu.RLock()
	known, ok := m.known[key]
	m.mu.RUnlock()
	if ok {
		return &known, nil
	}
	got, err := m.RESTMapper.RESTMapping(gk, versions...)
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	m.known[key] = *got
	m.mu.Unlock()
	out := *got
	return &out, nil
}

// rememberingMapperProvider is the manager's default mapper (the dynamic
// one), remembered.
func rememberingMapperProvider(c *rest.Config, httpClient *http.Client) (meta.RESTMapper, error) {
	m, err := apiutil.NewDynamicRESTMapper(c, httpClient)
	if err != nil {
		return nil, err
	}
	return newRememberingMapper(m), nil
}
