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

// withRepository runs the agent on a repository fake that starts with loadable and
// polls every millisecond; more options may follow (configured labels, say).
func withRepository(t *testing.T, loadable ...string) (*repository, option) {
	t.Helper()
	f := backendtest.New()
	f.Inv.Loadable = loadable
	repo := &repository{Fake: f, lists: make(chan []string)}
	return repo, func(h *harness) {
		withFake(f)(h)
		h.cfg.Backend = repo
		h.cfg.InventoryInterval = time.Millisecond
	}
}

// welcomeWithInventory is a Welcome from a dispatcher that takes Inventory frames.
func welcomeWithInventory() *pb.Welcome {
	return &pb.Welcome{ProtocolVersion: frame.ProtocolVersion, InventoryUpdates: true}
}

// A change the poll finds after the hello was built, before the Welcome said the
// dispatcher takes Inventory frames, is told once the Welcome arrives: otherwise the
// dispatcher would not hear of it until the next change or connection.
func TestLoadableChangeDuringTheHandshakeIsTold(t *testing.T) {
	t.Parallel()
	repo, opt := withRepository(t, "a")
	h := setup(t, opt)
	p := h.accept()
	hello, err := frame.CheckHello(p.read(), p.workerID)
	if err != nil || !slices.Equal(hello.GetLoadableLabels(), []string{"a"}) {
		t.Fatalf("hello %v, %v", hello, err)
	}
	repo.lists <- []string{"a", "b"}
	repo.lists <- []string{"a", "b"} // taken by the next poll: the first was handled
	p.send(&pb.Envelope{Body: &pb.Envelope_Welcome{Welcome: welcomeWithInventory()}})
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
	repo, opt := withRepository(t, "a", "b")
	h := setup(t, opt, withConfig(func(c *agent.Config) { c.Labels = []string{"a", "b", "c"} }))
	p := h.connectWith(welcomeWithInventory())
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
	repo, opt := withRepository(t, "a", "b")
	h := setup(t, opt)
	p := h.connectWith(welcomeWithInventory())
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
