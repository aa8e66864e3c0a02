package agent_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/smartroute/smartroute/proto/frame"
	pb "github.com/smartroute/smartroute/proto/smartroutev1"
	"github.com/smartroute/smartroute/worker-agent/agent"
	"github.com/smartroute/smartroute/worker-agent/backend/backendtest"
)

// repository is a fake backend whose loadable labels the test hands to each inventory
// poll, one list per poll: a send returns once a poll has taken it.
type repository struct {
	*backendtest.Fake
	lists chan []string
}

func (r *repository) Loadable(ctx context.Context) ([]string, error) {
	select {
	case l := <-r.lists:
		return l, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// A change the poll finds after the hello was built, before the Welcome said the
// dispatcher takes Inventory frames, is told once the Welcome arrives: otherwise the
// dispatcher would not hear of it until the next change or connection.
func TestLoadableChangeDuringTheHandshakeIsTold(t *testing.T) {
	t.Parallel()
	f := backendtest.New()
	f.Inv.Loadable = []string{"a"}
	repo := &repository{Fake: f, lists: make(chan []string)}
	h := setup(t, withFake(f), withConfig(func(c *agent.Config) {
		c.Backend = repo
		c.InventoryInterval = time.Millisecond
	}))
	p := h.accept()
	hello, err := frame.CheckHello(p.read(), p.workerID)
	if err != nil || !slices.Equal(hello.GetLoadableLabels(), []string{"a"}) {
		t.Fatalf("hello %v, %v", hello, err)
	}
	repo.lists <- []string{"a", "b"}
	repo.lists <- []string{"a", "b"} // taken by the next poll: the first was handled
	p.send(&pb.Envelope{Body: &pb.Envelope_Welcome{Welcome: &pb.Welcome{ProtocolVersion: frame.ProtocolVersion, InventoryUpdates: true}}})
	if got := p.next().GetInventory().GetLoadableLabels(); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("inventory %q, want a and b", got)
	}
	// Unchanged lists are not told again, and an empty one (a repository emptied
	// mid-deploy) is not taken as "any label".
	repo.lists <- []string{"b", "a"}
	repo.lists <- nil
	repo.lists <- []string{"a"}
	if got := p.next().GetInventory().GetLoadableLabels(); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("inventory %q, want a", got)
	}
	if err := h.stop(p); err != nil {
		t.Fatal(err)
	}
}

// An empty index (Triton restarted on an empty repository, mid-deploy) is ignored with
// --labels set too, rather than widened to every configured label.
func TestEmptyIndexIsIgnoredWithConfiguredLabels(t *testing.T) {
	t.Parallel()
	f := backendtest.New()
	f.Inv.Loadable = []string{"a", "b"}
	repo := &repository{Fake: f, lists: make(chan []string)}
	h := setup(t, withFake(f), withConfig(func(c *agent.Config) {
		c.Backend = repo
		c.Labels = []string{"a", "b", "c"}
		c.InventoryInterval = time.Millisecond
	}))
	p := h.connectWith(&pb.Welcome{ProtocolVersion: frame.ProtocolVersion, InventoryUpdates: true})
	if got := p.hello.GetLoadableLabels(); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("hello lists %q, want a and b", got)
	}
	repo.lists <- nil
	repo.lists <- []string{"a"}
	if got := p.next().GetInventory().GetLoadableLabels(); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("inventory %q, want a (the empty index ignored)", got)
	}
	if err := h.stop(p); err != nil {
		t.Fatal(err)
	}
}

// An assignment the dispatcher sent before it read the Inventory that removed its
// label is refused, to run elsewhere, not answered as the task's failure (a 502).
func TestAssignmentCrossingARemovalIsRefused(t *testing.T) {
	t.Parallel()
	f := backendtest.New()
	f.Inv.Loadable = []string{"a", "b"}
	repo := &repository{Fake: f, lists: make(chan []string)}
	h := setup(t, withFake(f), withConfig(func(c *agent.Config) {
		c.Backend = repo
		c.InventoryInterval = time.Millisecond
	}))
	p := h.connectWith(&pb.Welcome{ProtocolVersion: frame.ProtocolVersion, InventoryUpdates: true})
	repo.lists <- []string{"a"}
	if got := p.next().GetInventory().GetLoadableLabels(); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("inventory %q, want a", got)
	}
	if r := p.run("t1", "b", ""); !r.GetRefused() || r.GetLoadFailed() {
		t.Fatalf("result %v, want refused", r)
	}
	if err := h.stop(p); err != nil {
		t.Fatal(err)
	}
}
