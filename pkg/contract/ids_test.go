package contract_test

import (
	"testing"

	"github.com/google/uuid"

	"github.com/converge-sync/converge/pkg/contract"
)

// The expected values were computed with an independent UUIDv5 and SHA-256
// implementation (Python's uuid and hashlib), not with this package.
func TestKnownAnswers(t *testing.T) {
	ev := contract.EventID("docs/intro.md", 3, contract.KindUpserted)
	tests := []struct {
		name string
		got  string
		want string
	}{
		{"document id", contract.DocumentID("docs/intro.md").String(), "0fa7537e-2b86-557c-bad9-bd221a1c851d"},
		{"document id, non-ASCII key", contract.DocumentID("ключ:ü").String(), "a95ce946-1201-5faf-8781-b1aa0849814e"},
		{"chunk id", contract.ChunkID("docs/intro.md", 1, 0).String(), "e194ad45-bca0-5b09-b81d-c96bf99a7525"},
		{"chunk id, later version and ordinal", contract.ChunkID("docs/intro.md", 42, 7).String(), "59fccf8f-7bb9-5425-ba71-1fbfcbdc2c59"},
		{"chunk id, max version", contract.ChunkID("a", 9223372036854775807, 0).String(), "2c43928c-bb71-58ab-909e-5f143d6f0d36"},
		{"event id, upserted", ev.String(), "492ccf8a-2617-5500-bdbe-0374803089f8"},
		{"event id, withdrawn", contract.EventID("docs/intro.md", 4, contract.KindWithdrawn).String(), "b53816c2-2637-57ba-b67b-7a12f08cacb8"},
		{"effect id", contract.EffectID("webhook", ev).String(), "da1e3940-9364-5eca-bccc-49fc5dfe83f3"},
		{"subject token", contract.SubjectToken("docs/intro.md"), "22760d417a52c66f14bee182587d458d"},
		{"subject", contract.Subject("docs/intro.md"), "converge.docs.22760d417a52c66f14bee182587d458d"},
		{"withdrawn hash", contract.WithdrawnHash("docs/intro.md"), "383d735598aaf7731de655088661794b37d4febdd5aee673b4a7261cda70f2fe"},
	}
	for _, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("%s = %s, want %s", tt.name, tt.got, tt.want)
		}
	}
}

func TestNamespacesAreFixed(t *testing.T) {
	for name, tt := range map[string]struct {
		ns   uuid.UUID
		want string
	}{
		"document": {contract.DocumentNS, "a124f2c4-56d6-46e9-8eac-25e65d2438a7"},
		"chunk":    {contract.ChunkNS, "4293b1be-71ad-4498-8b17-b1e89f93a5e2"},
		"event":    {contract.EventNS, "b27e3a11-20ef-4fb1-9718-8c59d8dd81a0"},
		"effect":   {contract.EffectNS, "e5ecf0c4-bd72-4ec1-ac6c-e4a35711b58b"},
	} {
		if tt.ns.String() != tt.want {
			t.Errorf("%s namespace = %s, want %s", name, tt.ns, tt.want)
		}
	}
}

func TestIdentifiersSeparateTheirInputs(t *testing.T) {
	// Each component of the tuple must change the id; no two families collide.
	base := contract.ChunkID("k", 1, 0)
	for _, other := range []uuid.UUID{
		contract.ChunkID("k", 2, 0),
		contract.ChunkID("k", 1, 1),
		contract.ChunkID("k2", 1, 0),
		contract.EventID("k", 1, contract.KindUpserted),
		contract.DocumentID("k"),
	} {
		if other == base {
			t.Fatalf("id %s collides with chunk id of (k,1,0)", other)
		}
	}
	if contract.EventID("k", 1, contract.KindUpserted) == contract.EventID("k", 1, contract.KindWithdrawn) {
		t.Fatal("upserted and withdrawn events of one version share an id")
	}
	if got := len(contract.SubjectToken("")); got != contract.TokenLength {
		t.Fatalf("token length %d, want %d", got, contract.TokenLength)
	}
}
