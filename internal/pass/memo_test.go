package pass

import "testing"

// A memo keeps at most its size of answers, forgetting the least recently
// used first (issue 39: no unbounded memo of registry answers); an answer
// forgotten is asked again.
func TestMemo_IsBoundedAndForgetsTheLeastRecentlyUsed(t *testing.T) {
	m := newMemo[string, []string](2)
	m.add("a", []string{"1"})
	m.add("b", nil)
	if _, ok := m.get("a"); !ok { // a is now the most recently used
		t.Fatal("a forgotten before the memo was full")
	}
	m.add("c", []string{"3"})
	if _, ok := m.get("b"); ok {
		t.Error("b kept: the memo holds more than its size")
	}
	if got, ok := m.get("a"); !ok || len(got) != 1 || got[0] != "1" {
		t.Errorf("a = %v, %v; want [1], kept (used more recently than b)", got, ok)
	}
	if got, ok := m.get("missing"); ok || got != nil {
		t.Errorf("an unknown key answers %v, %v", got, ok)
	}
	r := &Runner{}
	if r.memo() != r.memo() || r.memo().signed == nil {
		t.Error("a Runner's memos are not made once")
	}
}
