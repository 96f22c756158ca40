package pinwebhook

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

// MaxReviewBytes bounds the body of one request. The kube-apiserver accepts
// a write of at most 3 MiB; an UPDATE's AdmissionReview carries that object
// and the stored one, and 1 MiB is left for the rest of the review (the
// bound controller-runtime's admission server uses too). A larger body is
// refused with 413 before it is read to the end.
const MaxReviewBytes = 7 << 20

// reviewVersion is the one AdmissionReview version served; the shipped
// configuration has admissionReviewVersions: ["v1"].
var reviewVersion = admissionv1.SchemeGroupVersion.WithKind("AdmissionReview")

// ServeHTTP serves Path. Only a POST of an admission.k8s.io/v1
// AdmissionReview with a request gets an admission answer: an
// AdmissionReview that always allows (with a patch for the pins, B1).
// Anything else gets a 4xx with a text/plain message naming what is wrong,
// and no AdmissionReview, so never a patch. The API server sends no such
// request; if it ever did, failurePolicy Ignore would admit the write
// unchanged and fix A re-pin it, as for an outage (B1 fails open).
// controller-runtime counts every answer by status code in
// controller_runtime_webhook_requests_total.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	req, code, err := h.readReview(w, r)
	if err != nil {
		h.log.Debug("admission webhook refused a request that is not an AdmissionReview",
			"status", code, "error", err.Error(), "remote", r.RemoteAddr, "method", r.Method)
		http.Error(w, "image-refresh admission webhook: "+err.Error(), code)
		return
	}
	areq := admission.Request{AdmissionRequest: *req}
	resp := h.Handle(r.Context(), areq)
	if err := resp.Complete(areq); err != nil { // sets the UID; encodes the patch
		resp = h.failOpen(areq, fmt.Errorf("encode the response: %w", err))
		resp.UID = req.UID
	}
	out, err := json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: reviewVersion.GroupVersion().String(), Kind: reviewVersion.Kind},
		Response: &resp.AdmissionResponse,
	})
	if err != nil {
		h.failOpen(areq, fmt.Errorf("encode the AdmissionReview: %w", err))
		http.Error(w, "image-refresh admission webhook: encode the AdmissionReview", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(out)
}

// readReview returns the request of the AdmissionReview that r carries, or
// the 4xx status and an error naming what is wrong.
func (h *Handler) readReview(w http.ResponseWriter, r *http.Request) (*admissionv1.AdmissionRequest, int, error) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		return nil, http.StatusMethodNotAllowed, fmt.Errorf("method %s is not allowed: send the AdmissionReview with POST", r.Method)
	}
	if err := jsonContentType(r.Header.Get("Content-Type")); err != nil {
		return nil, http.StatusUnsupportedMediaType, err
	}
	if r.ContentLength > h.maxBody {
		return nil, http.StatusRequestEntityTooLarge, fmt.Errorf("the body of %d bytes is larger than the limit of %d bytes", r.ContentLength, h.maxBody)
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, h.maxBody))
	if tooLarge := (*http.MaxBytesError)(nil); errors.As(err, &tooLarge) {
		return nil, http.StatusRequestEntityTooLarge, fmt.Errorf("the body is larger than the limit of %d bytes", h.maxBody)
	}
	if err != nil {
		return nil, http.StatusBadRequest, fmt.Errorf("read the body: %w", err)
	}
	return parseReview(body)
}

// jsonContentType accepts application/json, with charset utf-8 at most
// (JSON is UTF-8).
func jsonContentType(ct string) error {
	if ct == "" {
		return fmt.Errorf("no Content-Type: an AdmissionReview is application/json")
	}
	mt, params, err := mime.ParseMediaType(ct)
	if err != nil || mt != "application/json" {
		return fmt.Errorf("the Content-Type %q is not application/json", ct)
	}
	if cs, ok := params["charset"]; ok && !strings.EqualFold(cs, "utf-8") {
		return fmt.Errorf("the Content-Type %q names a charset other than utf-8", ct)
	}
	return nil
}

// parseReview decodes an admission.k8s.io/v1 AdmissionReview with a
// request. Keys are case-sensitive, as in the API server's own decoding.
func parseReview(body []byte) (*admissionv1.AdmissionRequest, int, error) {
	if len(bytes.TrimSpace(body)) == 0 {
		return nil, http.StatusBadRequest, fmt.Errorf("empty body: expected an %s %s", reviewVersion.GroupVersion(), reviewVersion.Kind)
	}
	if !json.Valid(body) {
		return nil, http.StatusBadRequest, fmt.Errorf("the body is not JSON")
	}
	var review admissionv1.AdmissionReview
	if err := utiljson.Unmarshal(body, &review); err != nil {
		return nil, http.StatusBadRequest, fmt.Errorf("the body is not an AdmissionReview: %w", err)
	}
	if review.APIVersion != reviewVersion.GroupVersion().String() || review.Kind != reviewVersion.Kind {
		return nil, http.StatusBadRequest, fmt.Errorf("the body has apiVersion %q and kind %q; expected apiVersion %q and kind %q",
			review.APIVersion, review.Kind, reviewVersion.GroupVersion(), reviewVersion.Kind)
	}
	if review.Request == nil {
		return nil, http.StatusBadRequest, fmt.Errorf("the AdmissionReview has no request")
	}
	if review.Request.UID == "" {
		return nil, http.StatusBadRequest, fmt.Errorf("the AdmissionReview's request has no uid")
	}
	return review.Request, 0, nil
}
