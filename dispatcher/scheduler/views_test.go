package scheduler

import (
	"slices"
	"testing"
)

// Views of many workers share one label buffer; each keeps its own labels, least
// recently used first, and appending to one view's labels leaves the next alone.
func TestAppendWorkerSharesOneBuffer(t *testing.T) {
	b := setup(t, Config{})
	b.worker("w1", 3, 1, "a", "b")
	b.worker("w2", 3, 1)
	b.worker("w3", 3, 1, "c", "d", "e")
	var buf []string
	views := map[string]WorkerView{}
	for _, id := range []string{"w1", "w2", "w3"} {
		var v WorkerView
		var ok bool
		v, buf, ok = b.s.AppendWorker(buf, id)
		if !ok {
			t.Fatalf("%s missing", id)
		}
		views[id] = v
	}
	if _, _, ok := b.s.AppendWorker(buf, "nobody"); ok {
		t.Fatal("a view of an unknown worker")
	}
	_ = append(views["w1"].Labels, "x") // must not overwrite w3's labels
	for id, v := range views {
		want, _ := b.s.Worker(id)
		if !slices.Equal(v.Labels, want.Labels) || v.ID != id || v.MaxLabels != 3 || v.Slots != 1 {
			t.Errorf("%s: view %+v, Worker %+v", id, v, want)
		}
	}
	if got := views["w3"].Labels; !slices.Equal(got, []string{"c", "d", "e"}) {
		t.Errorf("w3 labels %q", got)
	}
	if views["w2"].Labels != nil {
		t.Errorf("w2 holds nothing, got %q", views["w2"].Labels)
	}
}
