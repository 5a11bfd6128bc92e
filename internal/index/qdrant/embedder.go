package qdrant

import (
	"context"
	"fmt"

	"github.com/google/uuid"
	qd "github.com/qdrant/go-client/qdrant"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/converge-sync/converge/internal/embed"
)

// Payload fields of the embedder point.
const (
	typeEmbedder      = "embedder"
	fieldEmbedKind    = "embedder_kind"
	fieldEmbedModel   = "embedder_model"
	fieldEmbedDim     = "embedder_dimension"
	embedderPointName = "urn:converge:index:embedder"
)

// embedderID is the point that names the collection's embedder: a fixed
// id, in a namespace no document's id is derived in.
var embedderID = uuid.NewSHA1(uuid.NameSpaceURL, []byte(embedderPointName))

// Embedder reads the embedder point; none in a collection that does not
// exist yet or was made before embedders were recorded. See
// [index.Backend].
func (b *Backend) Embedder(ctx context.Context) (embed.Identity, bool, error) {
	var found []*qd.RetrievedPoint
	err := b.call(ctx, func(ctx context.Context) error {
		resp, err := b.client.GetPointsClient().Get(ctx, &qd.GetPoints{
			CollectionName: b.cfg.Collection,
			Ids:            []*qd.PointId{qd.NewIDUUID(embedderID.String())},
			WithPayload:    qd.NewWithPayload(true),
			WithVectors:    qd.NewWithVectors(false),
		})
		found = resp.GetResult()
		return err
	})
	if status.Code(err) == codes.NotFound {
		return embed.Identity{}, false, nil
	}
	if err != nil {
		return embed.Identity{}, false, b.fail("get the embedder", err)
	}
	if len(found) == 0 {
		return embed.Identity{}, false, nil
	}
	p := found[0].GetPayload()
	if t := p[fieldType].GetStringValue(); t != typeEmbedder {
		return embed.Identity{}, false, fmt.Errorf("qdrant: collection %q: point %s is a %q point, not the embedder's", b.cfg.Collection, embedderID, t)
	}
	id := embed.Identity{
		Kind:      p[fieldEmbedKind].GetStringValue(),
		Model:     p[fieldEmbedModel].GetStringValue(),
		Dimension: int(p[fieldEmbedDim].GetIntegerValue()),
	}
	if err := id.Validate(); err != nil {
		return embed.Identity{}, false, fmt.Errorf("qdrant: collection %q: %w", b.cfg.Collection, err)
	}
	return id, true, nil
}

// RecordEmbedder writes the embedder point (replacing it), with the
// fixed vector of a marker. See
// [index.Backend].
func (b *Backend) RecordEmbedder(ctx context.Context, id embed.Identity) error {
	if err := id.Validate(); err != nil {
		return fmt.Errorf("qdrant: %w", err)
	}
	dim, err := b.vectorSize(ctx)
	if err != nil {
		return err
	}
	point := &qd.PointStruct{
		Id:      qd.NewIDUUID(embedderID.String()),
		Vectors: fixedVector(dim),
		Payload: map[string]*qd.Value{
			fieldType:       qd.NewValueString(typeEmbedder),
			fieldEmbedKind:  qd.NewValueString(id.Kind),
			fieldEmbedModel: qd.NewValueString(id.Model),
			fieldEmbedDim:   qd.NewValueInt(int64(id.Dimension)),
		},
	}
	err = b.call(ctx, func(ctx context.Context) error {
		_, err := b.client.GetPointsClient().Upsert(ctx, &qd.UpsertPoints{
			CollectionName: b.cfg.Collection,
			Wait:           qd.PtrOf(true),
			Points:         []*qd.PointStruct{point},
		})
		return err
	})
	if err != nil {
		return b.fail("record the embedder", err)
	}
	return nil
}
