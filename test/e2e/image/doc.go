// Package image holds the test of the image-refresh container image: it runs
// the build path of `make image` (hack/image/build.sh: the base pusher in
// hack/image/base, then ko with .ko.yaml) against a test registry and checks
// what was pushed. See docs/image.md.
package image
