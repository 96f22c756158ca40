package pinwebhook

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
)

// tagOfAPI is the configured tag of image api in testConfig.
const tagOfAPI = "reg.local:5000/acme/api:prod"

// records is an anchor that has recorded digest recorded for image api.
var records = map[string]string{"image-refresh.io/last-refreshed-api-digest": recorded}

// review describes an AdmissionReview as the API server sends it, for one
// workload in namespace tb.
type review struct {
	uid     string
	op      admissionv1.Operation
	kind    string // Deployment, DaemonSet or StatefulSet
	name    string
	images  []Container
	old     []Container // the stored object's containers; nil: no oldObject
	manager string      // field manager of the write
	dryRun  bool
}

// workloadJSON is a workload of kind with containers cs, as the API server
// serializes it.
func workloadJSON(tb testing.TB, kind, name string, cs []Container) []byte {
	tb.Helper()
	meta := metav1.ObjectMeta{Namespace: "tb", Name: name, Labels: map[string]string{"app": name, "image-refresh.io/managed": "true"}}
	selector := &metav1.LabelSelector{MatchLabels: map[string]string{"app": name}}
	tmpl := corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": name}}}
	for _, c := range cs {
		tmpl.Spec.Containers = append(tmpl.Spec.Containers, corev1.Container{Name: c.Name, Image: c.Image, ImagePullPolicy: corev1.PullIfNotPresent})
	}
	tm := metav1.TypeMeta{APIVersion: "apps/v1", Kind: kind}
	var obj any
	switch kind {
	case "Deployment":
		obj = appsv1.Deployment{TypeMeta: tm, ObjectMeta: meta, Spec: appsv1.DeploymentSpec{Selector: selector, Template: tmpl}}
	case "DaemonSet":
		obj = appsv1.DaemonSet{TypeMeta: tm, ObjectMeta: meta, Spec: appsv1.DaemonSetSpec{Selector: selector, Template: tmpl}}
	case "StatefulSet":
		obj = appsv1.StatefulSet{TypeMeta: tm, ObjectMeta: meta, Spec: appsv1.StatefulSetSpec{Selector: selector, Template: tmpl, ServiceName: name}}
	default:
		tb.Fatalf("kind %s", kind)
	}
	b, err := json.Marshal(obj)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

func (r review) body(tb testing.TB) []byte {
	tb.Helper()
	optionsKind := "CreateOptions"
	if r.op == admissionv1.Update {
		optionsKind = "UpdateOptions"
	}
	options, _ := json.Marshal(map[string]string{"apiVersion": "meta.k8s.io/v1", "kind": optionsKind, "fieldManager": r.manager})
	resource := map[string]string{"Deployment": "deployments", "DaemonSet": "daemonsets", "StatefulSet": "statefulsets"}[r.kind]
	req := &admissionv1.AdmissionRequest{
		UID:       types.UID(r.uid),
		Kind:      metav1.GroupVersionKind{Group: "apps", Version: "v1", Kind: r.kind},
		Resource:  metav1.GroupVersionResource{Group: "apps", Version: "v1", Resource: resource},
		Name:      r.name,
		Namespace: "tb",
		Operation: r.op,
		Object:    runtime.RawExtension{Raw: workloadJSON(tb, r.kind, r.name, r.images)},
		Options:   runtime.RawExtension{Raw: options},
		DryRun:    &r.dryRun,
	}
	req.RequestKind, req.RequestResource = &req.Kind, &req.Resource
	if r.old != nil {
		req.OldObject = runtime.RawExtension{Raw: workloadJSON(tb, r.kind, r.name, r.old)}
	}
	b, err := json.Marshal(admissionv1.AdmissionReview{TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"}, Request: req})
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// revertReview is `helm upgrade` putting the tag back on jobs/api: the
// webhook pins it to recorded.
func revertReview(tb testing.TB, uid string) []byte {
	return review{uid: uid, op: admissionv1.Update, kind: "Deployment", name: "jobs", manager: "helm",
		images: []Container{{"api", tagOfAPI}}, old: []Container{{"api", tagOfAPI + "@" + recorded}}}.body(tb)
}

// admissionAnswer decodes an AdmissionReview response, or returns nil.
func admissionAnswer(body []byte) *admissionv1.AdmissionResponse {
	var r admissionv1.AdmissionReview
	if json.Unmarshal(body, &r) != nil {
		return nil
	}
	return r.Response
}

func httpsClient(certs *SelfSigned) *http.Client {
	return &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool(certs.CA())}}}
}

// onlyReader hides a body's length, so the request is sent chunked.
type onlyReader struct{ io.Reader }

func TestWebhook_B1_RejectsRequestsThatAreNotAdmissionReviews(t *testing.T) {
	h, m := newTestHandler(records, nil, true)
	certs := selfSigned(t)
	url := "https://" + startServer(t, Options{}, certs, h) + Path
	client := httpsClient(certs)
	valid := revertReview(t, "uid-1")
	withReview := func(edit func(r map[string]any)) []byte {
		var r map[string]any
		if err := json.Unmarshal(valid, &r); err != nil {
			t.Fatal(err)
		}
		edit(r)
		b, _ := json.Marshal(r)
		return b
	}
	request := func(edit func(r map[string]any)) []byte {
		return withReview(func(r map[string]any) { edit(r["request"].(map[string]any)) })
	}
	// padded is the valid review followed by whitespace, n bytes in all.
	padded := func(n int) []byte { return append(bytes.Clone(valid), bytes.Repeat([]byte(" "), n-len(valid))...) }

	cases := []struct {
		name        string
		method, ct  string
		body        []byte
		chunked     bool
		wantStatus  int
		wantPatch   bool   // for 200
		wantMessage string // in the 4xx body
	}{
		{"a valid review is pinned", http.MethodPost, "application/json", valid, false, 200, true, ""},
		{"a valid review with charset utf-8 is pinned", http.MethodPost, "application/json; charset=utf-8", valid, false, 200, true, ""},
		{"a valid review sent chunked is pinned", http.MethodPost, "application/json", valid, true, 200, true, ""},
		{"a valid review of exactly the size limit is pinned", http.MethodPost, "application/json", padded(MaxReviewBytes), false, 200, true, ""},
		{"a valid review whose object does not decode is allowed unchanged (fails open)", http.MethodPost, "application/json",
			request(func(r map[string]any) { r["object"] = map[string]any{"spec": map[string]any{"template": 5}} }), false, 200, false, ""},

		{"GET", http.MethodGet, "", nil, false, 405, false, "method GET is not allowed"},
		{"GET with a valid review", http.MethodGet, "application/json", valid, false, 405, false, "method GET is not allowed"},
		{"PUT with a valid review", http.MethodPut, "application/json", valid, false, 405, false, "method PUT is not allowed"},
		{"no Content-Type", http.MethodPost, "", valid, false, 415, false, "no Content-Type"},
		{"text/plain", http.MethodPost, "text/plain", valid, false, 415, false, `the Content-Type "text/plain" is not application/json`},
		{"application/yaml", http.MethodPost, "application/yaml", valid, false, 415, false, `"application/yaml" is not application/json`},
		{"application/json with another charset", http.MethodPost, "application/json; charset=latin1", valid, false, 415, false, "charset other than utf-8"},
		{"a Content-Type that does not parse", http.MethodPost, "application/json; ;", valid, false, 415, false, "is not application/json"},
		{"an empty body", http.MethodPost, "application/json", nil, false, 400, false, "empty body"},
		{"a body that is not JSON", http.MethodPost, "application/json", []byte("apiVersion: admission.k8s.io/v1\nkind: AdmissionReview\n"), false, 400, false, "the body is not JSON"},
		{"truncated JSON", http.MethodPost, "application/json", valid[:len(valid)/2], false, 400, false, "the body is not JSON"},
		{"two JSON documents", http.MethodPost, "application/json", append(bytes.Clone(valid), valid...), false, 400, false, "the body is not JSON"},
		{"a JSON array", http.MethodPost, "application/json", []byte(`[` + string(valid) + `]`), false, 400, false, "the body is not an AdmissionReview: json: cannot unmarshal array"},
		{"JSON null", http.MethodPost, "application/json", []byte(`null`), false, 400, false, `apiVersion "" and kind ""`},
		{"a v1beta1 AdmissionReview", http.MethodPost, "application/json", withReview(func(r map[string]any) { r["apiVersion"] = "admission.k8s.io/v1beta1" }),
			false, 400, false, `apiVersion "admission.k8s.io/v1beta1" and kind "AdmissionReview"; expected apiVersion "admission.k8s.io/v1" and kind "AdmissionReview"`},
		{"no apiVersion", http.MethodPost, "application/json", withReview(func(r map[string]any) { delete(r, "apiVersion") }), false, 400, false, `apiVersion "" and kind "AdmissionReview"`},
		{"another kind", http.MethodPost, "application/json", withReview(func(r map[string]any) { r["kind"] = "Deployment" }), false, 400, false, `kind "Deployment"`},
		{"an apiVersion key in another case", http.MethodPost, "application/json",
			withReview(func(r map[string]any) { r["APIVersion"] = r["apiVersion"]; delete(r, "apiVersion") }), false, 400, false, `apiVersion ""`},
		{"a review without request", http.MethodPost, "application/json", withReview(func(r map[string]any) { delete(r, "request") }), false, 400, false, "the AdmissionReview has no request"},
		{"a review with request null", http.MethodPost, "application/json", withReview(func(r map[string]any) { r["request"] = nil }), false, 400, false, "the AdmissionReview has no request"},
		{"a request without uid", http.MethodPost, "application/json", request(func(r map[string]any) { delete(r, "uid") }), false, 400, false, "the AdmissionReview's request has no uid"},
		{"a request whose uid is a number", http.MethodPost, "application/json", request(func(r map[string]any) { r["uid"] = 1e300 }),
			false, 400, false, "the body is not an AdmissionReview: json: cannot unmarshal number"},
		{"a request whose dryRun is a huge number", http.MethodPost, "application/json", request(func(r map[string]any) { r["dryRun"] = json.Number("1" + strings.Repeat("0", 400)) }),
			false, 400, false, "the body is not an AdmissionReview: json: cannot unmarshal number"},
		{"a body one byte over the limit", http.MethodPost, "application/json", padded(MaxReviewBytes + 1), false, 413, false,
			"the body of 7340033 bytes is larger than the limit of 7340032 bytes"},
		{"a chunked body one byte over the limit", http.MethodPost, "application/json", padded(MaxReviewBytes + 1), true, 413, false,
			"the body is larger than the limit of 7340032 bytes"},
	}
	pins := 0
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var body io.Reader = bytes.NewReader(c.body)
			if c.chunked {
				body = onlyReader{body}
			}
			req, err := http.NewRequest(c.method, url, body)
			if err != nil {
				t.Fatal(err)
			}
			if c.body == nil {
				req.Body, req.ContentLength = nil, 0
			}
			if c.ct != "" {
				req.Header.Set("Content-Type", c.ct)
			}
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != c.wantStatus {
				t.Fatalf("status %d, want %d: %.300s", resp.StatusCode, c.wantStatus, got)
			}
			answer := admissionAnswer(got)
			if c.wantStatus != 200 {
				if answer != nil || bytes.Contains(got, []byte("patch")) {
					t.Errorf("a %d carries an admission answer: %.300s", resp.StatusCode, got)
				}
				if !strings.Contains(string(got), c.wantMessage) {
					t.Errorf("message %q does not say %q", got, c.wantMessage)
				}
				if c.wantStatus == 405 && resp.Header.Get("Allow") != http.MethodPost {
					t.Errorf("405 without Allow: POST (Allow %q)", resp.Header.Get("Allow"))
				}
				return
			}
			if answer == nil || !answer.Allowed || answer.UID != "uid-1" {
				t.Fatalf("want an allowing answer for uid-1: %.300s", got)
			}
			if patched := len(answer.Patch) > 0; patched != c.wantPatch {
				t.Errorf("patched %v, want %v: %s", patched, c.wantPatch, answer.Patch)
			}
			if c.wantPatch {
				pins++
				want := `[{"op":"replace","path":"/spec/template/spec/containers/0/image","value":"` + tagOfAPI + "@" + recorded + `"}]`
				if string(answer.Patch) != want || answer.PatchType == nil || *answer.PatchType != admissionv1.PatchTypeJSONPatch {
					t.Errorf("patch %s (%v), want %s", answer.Patch, answer.PatchType, want)
				}
			}
		})
	}
	// Every pin counted came from a valid review: no other request reached
	// the admission decision.
	if n := count(m.AdmissionPins.WithLabelValues("cp", "api")); n != float64(pins) {
		t.Errorf("image_refresh_admission_pins_total = %v, want %d (the valid reviews only)", n, pins)
	}
}

// A body announced as larger than the limit is refused from its headers:
// the server does not wait for (or read) a gigabyte.
func TestWebhook_B1_AnOversizedBodyIsRefusedBeforeItIsRead(t *testing.T) {
	h, _ := newTestHandler(records, nil, true)
	certs := selfSigned(t)
	addr := startServer(t, Options{}, certs, h)
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, &tls.Config{RootCAs: pool(certs.CA()), ServerName: "127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	_, err = io.WriteString(conn, "POST "+Path+" HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 1073741824\r\n\r\n{")
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no answer within 5 s to a request announcing 1 GiB: %v", err)
	}
	got, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<10))
	if resp.StatusCode != http.StatusRequestEntityTooLarge || !strings.Contains(string(got), "the body of 1073741824 bytes is larger than the limit of 7340032 bytes") {
		t.Errorf("%s: %q; want 413 naming the size and the limit", resp.Status, got)
	}
}

func TestWebhook_B1_PlainHTTPToTheTLSPortGetsNoAdmissionAnswer(t *testing.T) {
	h, m := newTestHandler(records, nil, true)
	certs := selfSigned(t)
	addr := startServer(t, Options{}, certs, h)
	body := revertReview(t, "uid-plain")

	resp, err := (&http.Client{Timeout: 5 * time.Second}).Post("http://"+addr+Path, "application/json", bytes.NewReader(body))
	if err == nil {
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		t.Logf("plain HTTP: %s %q", resp.Status, got)
		if resp.StatusCode < 400 || admissionAnswer(got) != nil || bytes.Contains(got, []byte("patch")) {
			t.Errorf("plain HTTP got %s with %.300s; want no admission answer", resp.Status, got)
		}
	} else {
		t.Logf("plain HTTP: %v", err)
	}
	if n := count(m.AdmissionPins.WithLabelValues("cp", "api")); n != 0 {
		t.Fatalf("a plain-HTTP request reached the admission decision (%v pins)", n)
	}

	// The same body over TLS is pinned: it was the transport that was refused.
	resp, err = httpsClient(certs).Post("https://"+addr+Path, "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if a := admissionAnswer(got); a == nil || a.UID != "uid-plain" || len(a.Patch) == 0 {
		t.Fatalf("over TLS: %s %.300s; want a patch", resp.Status, got)
	}
}
