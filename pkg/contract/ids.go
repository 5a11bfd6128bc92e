package contract

import (
	"strconv"

	"github.com/google/uuid"
)

// Namespaces of the identifier families. They are fixed forever: changing one
// changes every identifier of its family and breaks idempotence across
// deployments. Known-answer tests pin them.
var (
	DocumentNS = uuid.MustParse("a124f2c4-56d6-46e9-8eac-25e65d2438a7")
	ChunkNS    = uuid.MustParse("4293b1be-71ad-4498-8b17-b1e89f93a5e2")
	EventNS    = uuid.MustParse("b27e3a11-20ef-4fb1-9718-8c59d8dd81a0")
	EffectNS   = uuid.MustParse("e5ecf0c4-bd72-4ec1-ac6c-e4a35711b58b")
)

// DocumentID is the identity of a document across all versions:
// uuid5(DocumentNS, key).
func DocumentID(key string) uuid.UUID {
	return uuid.NewSHA1(DocumentNS, []byte(key))
}

// ChunkID is the identity of the chunk at ordinal of a document version:
// uuid5(ChunkNS, key + ":" + version + ":" + ordinal).
func ChunkID(key string, version int64, ordinal int) uuid.UUID {
	name := make([]byte, 0, len(key)+24)
	name = append(name, key...)
	name = append(name, ':')
	name = strconv.AppendInt(name, version, 10)
	name = append(name, ':')
	name = strconv.AppendInt(name, int64(ordinal), 10)
	return uuid.NewSHA1(ChunkNS, name)
}

// EventID is the identity of the event of kind for a document version:
// uuid5(EventNS, key + ":" + version + ":" + kind). It is also the JetStream
// Nats-Msg-Id, so a republished event is recognised as the same event.
func EventID(key string, version int64, kind Kind) uuid.UUID {
	name := make([]byte, 0, len(key)+40)
	name = append(name, key...)
	name = append(name, ':')
	name = strconv.AppendInt(name, version, 10)
	name = append(name, ':')
	name = append(name, kind...)
	return uuid.NewSHA1(EventNS, name)
}

// EffectID is the identity of a non-idempotent effect (such as one webhook
// notification) caused by an event: uuid5(EffectNS, effect + ":" + eventID).
// Receivers deduplicate on it.
func EffectID(effect string, eventID uuid.UUID) uuid.UUID {
	return uuid.NewSHA1(EffectNS, []byte(effect+":"+eventID.String()))
}
