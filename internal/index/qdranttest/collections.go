package qdranttest

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/qdrant/go-client/qdrant"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// collection is one collection's configuration and points.
type collection struct {
	dim      int
	distance qdrant.Distance
	indexes  map[string]qdrant.PayloadSchemaType
	points   map[pointID]*point
	byKey    map[string]map[pointID]*point // see keyindex.go
	strict   *qdrant.StrictModeConfig      // see strict.go
	sizes    sizeStatsCache                // see strict.go
	// preventUnoptimized is optimizers_config.prevent_unoptimized (from
	// Qdrant 1.17), which the server reports only.
	preventUnoptimized *bool
}

// maxVectorSize is Qdrant's limit on a dense vector's dimension.
const maxVectorSize = 65536

type collectionsService struct {
	qdrant.UnimplementedCollectionsServer
	s *Server
}

func (cs *collectionsService) Create(_ context.Context, req *qdrant.CreateCollection) (*qdrant.CollectionOperationResponse, error) {
	start := time.Now()
	name := req.GetCollectionName()
	if err := validCollectionName(name); err != nil {
		return nil, err
	}
	vc := req.GetVectorsConfig()
	if vc == nil {
		return nil, unsupported("a collection without a dense vector")
	}
	if vc.GetParamsMap() != nil {
		return nil, unsupported("named vectors")
	}
	p := vc.GetParams()
	if p.GetSize() < 1 || p.GetSize() > maxVectorSize {
		return nil, status.Errorf(codes.InvalidArgument, "Validation error in body: [vectors_config.config.size: value %d invalid, must be from 1 to %d]", p.GetSize(), maxVectorSize)
	}
	switch p.GetDistance() {
	case qdrant.Distance_Cosine, qdrant.Distance_Dot, qdrant.Distance_Euclid, qdrant.Distance_Manhattan:
	default:
		return nil, badInput("unknown distance %v", p.GetDistance())
	}
	switch {
	case p.GetDatatype() != qdrant.Datatype_Default && p.GetDatatype() != qdrant.Datatype_Float32:
		return nil, unsupported("a vector datatype other than float32")
	case p.MultivectorConfig != nil:
		return nil, unsupported("multivectors")
	case req.SparseVectorsConfig != nil:
		return nil, unsupported("sparse vectors")
	case req.ShardingMethod != nil && req.GetShardingMethod() == qdrant.ShardingMethod_Custom:
		return nil, unsupported("custom sharding")
	}

	s := cs.s
	s.mu.Lock()
	defer s.mu.Unlock()
	// Qdrant answers AlreadyExists here (with its "Wrong input" message):
	// lib/storage/src/content_manager/collections_ops.rs
	// (validate_collection_not_exists) and the StorageError to tonic code
	// mapping in lib/storage/src/content_manager/conversions.rs. A clash
	// with an alias is BadInput (lib/storage/src/content_manager/toc/create_collection.rs).
	if _, ok := s.collections[name]; ok {
		return nil, alreadyExists("Collection `%s` already exists!", name)
	}
	if _, ok := s.aliases[name]; ok {
		return nil, badInput("Can't create collection with name %s. Alias with the same name already exists", name)
	}
	s.collections[name] = &collection{
		dim:      int(p.GetSize()),
		distance: p.GetDistance(),
		indexes:  make(map[string]qdrant.PayloadSchemaType),
		points:   make(map[pointID]*point),
		strict:   proto.CloneOf(req.GetStrictModeConfig()),
		sizes:    newSizeStatsCache(),
	}
	// Qdrant 1.16.3 does not know prevent_unoptimized: the field is
	// dropped as unknown.
	if oc := req.GetOptimizersConfig(); oc != nil && oc.PreventUnoptimized != nil && s.since117() {
		s.collections[name].preventUnoptimized = proto.Bool(oc.GetPreventUnoptimized())
	}
	return &qdrant.CollectionOperationResponse{Result: true, Time: since(start)}, nil
}

// validCollectionName applies Qdrant's rules for collection names, with
// Qdrant 1.16.3's messages: of the forbidden characters it names the first
// of its list that the name holds. Alias names are not checked, as in
// Qdrant 1.16.3, which creates an alias "a/b".
func validCollectionName(name string) error {
	if name == "" || len(name) > 255 {
		return status.Errorf(codes.InvalidArgument, "Validation error in body: [collection_name: value %q invalid, must be from 1 to 255 characters]", name)
	}
	for _, r := range forbiddenNameChars {
		if strings.ContainsRune(name, r) {
			return status.Errorf(codes.InvalidArgument, "Validation error in body: [collection_name: collection name cannot contain \"%c\" char]", r)
		}
	}
	return nil
}

const forbiddenNameChars = "<>:\"/\\|?*\x00"

func (cs *collectionsService) Get(_ context.Context, req *qdrant.GetCollectionInfoRequest) (*qdrant.GetCollectionInfoResponse, error) {
	start := time.Now()
	s := cs.s
	c, unlock, err := s.locked(req.GetCollectionName(), false)
	if err != nil {
		return nil, err
	}
	defer unlock()
	schema := make(map[string]*qdrant.PayloadSchemaInfo, len(c.indexes))
	for field, typ := range c.indexes {
		n := uint64(0)
		for _, p := range c.points {
			if _, ok := p.payload[field]; ok {
				n++
			}
		}
		schema[field] = &qdrant.PayloadSchemaInfo{DataType: typ, Points: &n}
	}
	count := uint64(len(c.points))
	indexed := uint64(0)
	return &qdrant.GetCollectionInfoResponse{
		Result: &qdrant.CollectionInfo{
			Status:          qdrant.CollectionStatus_Green,
			OptimizerStatus: &qdrant.OptimizerStatus{Ok: true},
			SegmentsCount:   1,
			Config: &qdrant.CollectionConfig{
				Params: &qdrant.CollectionParams{
					ShardNumber: 1,
					VectorsConfig: qdrant.NewVectorsConfig(&qdrant.VectorParams{
						Size:     uint64(c.dim),
						Distance: c.distance,
					}),
				},
				HnswConfig:       &qdrant.HnswConfigDiff{},
				OptimizerConfig:  &qdrant.OptimizersConfigDiff{PreventUnoptimized: c.preventUnoptimized},
				WalConfig:        &qdrant.WalConfigDiff{},
				StrictModeConfig: proto.CloneOf(c.strict),
			},
			PayloadSchema:       schema,
			PointsCount:         &count,
			IndexedVectorsCount: &indexed,
		},
		Time: since(start),
	}, nil
}

func (cs *collectionsService) List(context.Context, *qdrant.ListCollectionsRequest) (*qdrant.ListCollectionsResponse, error) {
	start := time.Now()
	s := cs.s
	s.mu.RLock()
	defer s.mu.RUnlock()
	names := make([]string, 0, len(s.collections))
	for name := range s.collections {
		names = append(names, name)
	}
	slices.Sort(names)
	out := make([]*qdrant.CollectionDescription, len(names))
	for i, name := range names {
		out[i] = &qdrant.CollectionDescription{Name: name}
	}
	return &qdrant.ListCollectionsResponse{Collections: out, Time: since(start)}, nil
}

// CollectionExists is true for a collection and for an alias of one: Qdrant
// looks the name up as every collection-scoped call does, resolving aliases
// (do_collection_exists in src/common/collections.rs, through
// TableOfContent::resolve_name in lib/storage/src/content_manager/toc/mod.rs).
func (cs *collectionsService) CollectionExists(_ context.Context, req *qdrant.CollectionExistsRequest) (*qdrant.CollectionExistsResponse, error) {
	start := time.Now()
	s := cs.s
	s.mu.RLock()
	defer s.mu.RUnlock()
	_, err := s.resolve(req.GetCollectionName())
	ok := err == nil
	return &qdrant.CollectionExistsResponse{Result: &qdrant.CollectionExists{Exists: ok}, Time: since(start)}, nil
}

// Delete drops a collection and the aliases pointing to it; a missing
// collection is not an error but a false result, as in Qdrant.
func (cs *collectionsService) Delete(_ context.Context, req *qdrant.DeleteCollection) (*qdrant.CollectionOperationResponse, error) {
	start := time.Now()
	name := req.GetCollectionName()
	s := cs.s
	s.mu.Lock()
	defer s.mu.Unlock()
	for alias, target := range s.aliases {
		if target == name {
			delete(s.aliases, alias)
		}
	}
	_, ok := s.collections[name]
	delete(s.collections, name)
	return &qdrant.CollectionOperationResponse{Result: ok, Time: since(start)}, nil
}

// UpdateAliases applies the actions in order while holding the lock, so no
// reader sees part of them. As in Qdrant, an action that fails leaves the
// earlier ones applied.
func (cs *collectionsService) UpdateAliases(_ context.Context, req *qdrant.ChangeAliases) (*qdrant.CollectionOperationResponse, error) {
	start := time.Now()
	s := cs.s
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, action := range req.GetActions() {
		switch a := action.GetAction().(type) {
		case *qdrant.AliasOperations_CreateAlias:
			alias, target := a.CreateAlias.GetAliasName(), a.CreateAlias.GetCollectionName()
			if _, ok := s.collections[target]; !ok {
				return nil, notFound("Collection `%s` doesn't exist!", target)
			}
			// validate_collection_not_exists, as for Create: AlreadyExists
			// (update_aliases in lib/storage/src/content_manager/toc/collection_meta_ops.rs).
			if _, ok := s.collections[alias]; ok {
				return nil, alreadyExists("Collection `%s` already exists!", alias)
			}
			s.aliases[alias] = target
		case *qdrant.AliasOperations_DeleteAlias:
			delete(s.aliases, a.DeleteAlias.GetAliasName())
		case *qdrant.AliasOperations_RenameAlias:
			old, renamed := a.RenameAlias.GetOldAliasName(), a.RenameAlias.GetNewAliasName()
			target, ok := s.aliases[old]
			if !ok {
				return nil, notFound("Alias %s does not exists!", old)
			}
			delete(s.aliases, old)
			s.aliases[renamed] = target
		default:
			return nil, badInput("alias operation is required")
		}
	}
	return &qdrant.CollectionOperationResponse{Result: true, Time: since(start)}, nil
}

func (cs *collectionsService) ListAliases(context.Context, *qdrant.ListAliasesRequest) (*qdrant.ListAliasesResponse, error) {
	start := time.Now()
	s := cs.s
	s.mu.RLock()
	defer s.mu.RUnlock()
	return &qdrant.ListAliasesResponse{Aliases: s.aliasesOf(""), Time: since(start)}, nil
}

// ListCollectionAliases lists the aliases whose target is exactly name. As
// in Qdrant it neither resolves name nor checks that the collection exists:
// a missing collection, or an alias name, has no aliases
// (do_list_collection_aliases in src/common/collections.rs).
func (cs *collectionsService) ListCollectionAliases(_ context.Context, req *qdrant.ListCollectionAliasesRequest) (*qdrant.ListAliasesResponse, error) {
	start := time.Now()
	s := cs.s
	s.mu.RLock()
	defer s.mu.RUnlock()
	return &qdrant.ListAliasesResponse{Aliases: s.aliasesOf(req.GetCollectionName()), Time: since(start)}, nil
}

// aliasesOf lists the aliases of collection (all of them for ""), sorted.
func (s *Server) aliasesOf(collection string) []*qdrant.AliasDescription {
	var out []*qdrant.AliasDescription
	for alias, target := range s.aliases {
		if collection == "" || target == collection {
			out = append(out, &qdrant.AliasDescription{AliasName: alias, CollectionName: target})
		}
	}
	slices.SortFunc(out, func(a, b *qdrant.AliasDescription) int { return strings.Compare(a.AliasName, b.AliasName) })
	return out
}

func (cs *collectionsService) Update(context.Context, *qdrant.UpdateCollection) (*qdrant.CollectionOperationResponse, error) {
	return nil, status.Error(codes.Unimplemented, "qdranttest: updating a collection's parameters is not supported by the test server")
}
