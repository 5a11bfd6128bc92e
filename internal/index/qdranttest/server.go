package qdranttest

import (
	"context"
	"crypto/subtle"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/qdrant/go-client/qdrant"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// Version is the Qdrant version the server follows and reports in
// HealthCheck.
const Version = "1.16.3"

// maxMessageBytes is Qdrant's default gRPC request limit (32 MiB).
const maxMessageBytes = 32 << 20

// Option configures a [Server].
type Option func(*Server)

// WithAPIKey makes the server require key in the "api-key" metadata (or as
// "authorization: Bearer <key>") on every call but HealthCheck: Qdrant's
// service.api_key, which may read and write.
func WithAPIKey(key string) Option {
	return func(s *Server) { s.keys.readWrite = key }
}

// WithReadOnlyAPIKey makes the server accept key too, for reads only:
// Qdrant's service.read_only_api_key. Every write made with it (upsert,
// delete, payload and vector updates, payload indexes, creating, updating
// or deleting a collection, alias changes) is refused with
// codes.PermissionDenied, "Forbidden: Global manage access is required",
// and has no effect; a point write or payload index creation on a missing
// collection is codes.NotFound instead, as in Qdrant. Alone, without
// [WithAPIKey], no key may write.
func WithReadOnlyAPIKey(key string) Option {
	return func(s *Server) { s.keys.readOnly = key }
}

// WithVersion makes HealthCheck report version v instead of [Version],
// and the server follow v where it models a change: from 1.17 it honours
// an upsert's update_mode and keeps a collection's
// optimizers_config.prevent_unoptimized, fields that Qdrant 1.16.3 does
// not know and ignores. Everything else stays as in 1.16.3.
func WithVersion(v string) Option {
	return func(s *Server) { s.version = v }
}

// since117 reports whether the server follows Qdrant 1.17 or later.
func (s *Server) since117() bool {
	v, err := qdrant.ParseVersion(s.version)
	return err == nil && (v.Major > 1 || v.Major == 1 && v.Minor >= 17)
}

// Server is an in-process Qdrant gRPC server. Its methods are safe for
// concurrent use.
type Server struct {
	version string
	lis     net.Listener
	grpc    *grpc.Server

	keysMu sync.RWMutex
	keys   apiKeys

	statsMu sync.Mutex
	stats   map[string]*callStats // by "Service/Method", e.g. "Points/Upsert"
	failing map[string]bool       // methods that fail (Fail)

	mu          sync.RWMutex
	collections map[string]*collection
	aliases     map[string]string // alias -> collection
	operationID uint64
}

// Start starts a server on 127.0.0.1 and stops it when the test ends.
func Start(t testing.TB, opts ...Option) *Server {
	t.Helper()
	s := &Server{
		version:     Version,
		stats:       make(map[string]*callStats),
		failing:     make(map[string]bool),
		collections: make(map[string]*collection),
		aliases:     make(map[string]string),
	}
	for _, o := range opts {
		o(s)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("qdranttest: listen: %v", err)
	}
	s.lis = lis
	s.grpc = grpc.NewServer(
		grpc.MaxRecvMsgSize(maxMessageBytes),
		grpc.ChainUnaryInterceptor(s.count, s.authenticate),
		// The Qdrant client pings idle connections every 10s; Qdrant
		// accepts that, grpc-go's default policy would hang up on it.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: time.Second, PermitWithoutStream: true}),
	)
	qdrant.RegisterQdrantServer(s.grpc, healthService{s: s})
	qdrant.RegisterCollectionsServer(s.grpc, &collectionsService{s: s})
	qdrant.RegisterPointsServer(s.grpc, &pointsService{s: s})
	go func() { _ = s.grpc.Serve(lis) }()
	t.Cleanup(s.grpc.Stop)
	return s
}

// Stop stops the server at once, closing every connection (an outage).
func (s *Server) Stop() { s.grpc.Stop() }

// Addr is the server's "host:port".
func (s *Server) Addr() string { return s.lis.Addr().String() }

// Host is the server's IP address, for qdrant.Config.
func (s *Server) Host() string { return s.lis.Addr().(*net.TCPAddr).IP.String() }

// Port is the server's TCP port, for qdrant.Config.
func (s *Server) Port() int { return s.lis.Addr().(*net.TCPAddr).Port }

// apiKeys are the keys the server accepts; an empty key is unset, as in
// Qdrant (AuthKeys::try_create in src/common/auth/mod.rs).
type apiKeys struct {
	readWrite, readOnly string
}

// SetAPIKeys replaces the server's keys, as restarting Qdrant with another
// service.api_key and service.read_only_api_key does: a client that keeps
// its key may lose (or regain) the right to write. Empty strings unset
// them, leaving the server open.
func (s *Server) SetAPIKeys(readWrite, readOnly string) {
	s.keysMu.Lock()
	defer s.keysMu.Unlock()
	s.keys = apiKeys{readWrite: readWrite, readOnly: readOnly}
}

// authenticate enforces the API keys the way Qdrant does: health checks are
// open, every other call needs a key. The read-write key may do anything;
// the read-only key is Qdrant's global read access (Access::full_ro in
// AuthKeys::validate_request, src/common/auth/mod.rs), which the gRPC
// middleware lets through (src/tonic/auth.rs) and every write then fails
// its access check: GlobalAccessMode::meets_requirements refuses a write
// or manage requirement with StorageError::Forbidden "Global manage access
// is required" (lib/storage/src/rbac/mod.rs), which Qdrant prints with the
// prefix "Forbidden: " (lib/storage/src/content_manager/errors.rs) and
// sends as codes.PermissionDenied (lib/storage/src/content_manager/
// conversions.rs).
//
// Where that check comes depends on the call. Point writes and payload
// index creation (true in [writeMethods]) check strict mode first (the do_*
// functions of src/common/update.rs), and check_strict_mode_toc_batch
// (lib/storage/src/content_manager/collection_verification.rs) asks only
// for read access before it looks the collection up: a missing collection
// is NotFound, even to the read-only key, and only then does
// TableOfContent::update (lib/storage/src/content_manager/toc/
// point_ops.rs) refuse the write. Collection and alias changes, and
// deleting a payload index, check access first, so the read-only key is
// refused them whether or not the collection exists. The server does not
// order strict-mode refusals before the access check: the read-only key
// gets PermissionDenied for a write that Qdrant would refuse for strict
// mode first.
func (s *Server) authenticate(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	s.keysMu.RLock()
	keys := s.keys
	s.keysMu.RUnlock()
	if keys == (apiKeys{}) || info.FullMethod == "/qdrant.Qdrant/HealthCheck" {
		return handler(ctx, req)
	}
	md, _ := metadata.FromIncomingContext(ctx)
	var given string
	if v := md.Get("api-key"); len(v) > 0 {
		given = v[0]
	} else if v := md.Get("authorization"); len(v) > 0 {
		given, _ = strings.CutPrefix(v[0], "Bearer ")
	}
	switch {
	case given == "":
		return nil, status.Error(codes.Unauthenticated, "Must provide an API key or an Authorization bearer token")
	case keyIs(given, keys.readWrite):
		return handler(ctx, req)
	case keyIs(given, keys.readOnly):
		resolvedFirst, write := writeMethods[strings.TrimPrefix(info.FullMethod, "/qdrant.")]
		if !write {
			return handler(ctx, req)
		}
		if named, ok := req.(interface{ GetCollectionName() string }); ok && resolvedFirst {
			_, unlock, err := s.locked(named.GetCollectionName(), false)
			if err != nil {
				return nil, err
			}
			unlock()
		}
		return nil, status.Error(codes.PermissionDenied, "Forbidden: Global manage access is required")
	}
	return nil, status.Error(codes.Unauthenticated, "Invalid API key or JWT")
}

func keyIs(given, key string) bool {
	return key != "" && subtle.ConstantTimeCompare([]byte(given), []byte(key)) == 1
}

// writeMethods are the calls that need more than read access, named as for
// [Server.Calls]: point, vector and payload updates need write access,
// payload indexes write and manage access, and collection and alias
// changes manage access (the access_requirements of
// CollectionUpdateOperations and check_collection_meta_operation in
// lib/storage/src/rbac/ops_checks.rs). Every other call of the services
// the server registers only reads. Some of these the server does not
// serve (it answers Unimplemented to the read-write key); the read-only
// key is refused them all the same, as Qdrant refuses it before applying
// anything. The value is true for the writes of which Qdrant looks the
// collection up before it checks write access (see authenticate): those
// that pass its strict-mode check first.
var writeMethods = map[string]bool{
	"Collections/Create":                       false,
	"Collections/Update":                       false,
	"Collections/Delete":                       false,
	"Collections/UpdateAliases":                false,
	"Collections/UpdateCollectionClusterSetup": false,
	"Collections/CreateShardKey":               false,
	"Collections/DeleteShardKey":               false,
	"Points/Upsert":                            true,
	"Points/Delete":                            true,
	"Points/UpdateVectors":                     true,
	"Points/DeleteVectors":                     true,
	"Points/SetPayload":                        true,
	"Points/OverwritePayload":                  true,
	"Points/DeletePayload":                     true,
	"Points/ClearPayload":                      true,
	"Points/CreateFieldIndex":                  true,
	"Points/DeleteFieldIndex":                  false,
	"Points/UpdateBatch":                       true,
}

type healthService struct {
	qdrant.UnimplementedQdrantServer
	s *Server
}

func (h healthService) HealthCheck(context.Context, *qdrant.HealthCheckRequest) (*qdrant.HealthCheckReply, error) {
	return &qdrant.HealthCheckReply{Title: "qdrant - vector search engine", Version: h.s.version}, nil
}

// callStats counts the calls of one method.
type callStats struct {
	calls, inFlight, maxInFlight int
}

// count records every call, authenticated or not.
func (s *Server) count(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	name := strings.TrimPrefix(info.FullMethod, "/qdrant.")
	s.statsMu.Lock()
	st := s.stats[name]
	if st == nil {
		st = &callStats{}
		s.stats[name] = st
	}
	st.calls++
	failing := s.failing[name]
	if failing {
		s.statsMu.Unlock()
		return nil, status.Errorf(codes.Unavailable, "qdranttest: %s fails (Server.Fail)", name)
	}
	st.inFlight++
	st.maxInFlight = max(st.maxInFlight, st.inFlight)
	s.statsMu.Unlock()
	defer func() {
		s.statsMu.Lock()
		st.inFlight--
		s.statsMu.Unlock()
	}()
	return handler(ctx, req)
}

// Calls is the number of calls of a method so far, named "Service/Method"
// as in Qdrant's service definitions: "Points/Upsert", "Points/Count",
// "Collections/UpdateAliases", "Qdrant/HealthCheck", ...
func (s *Server) Calls(method string) int {
	s.statsMu.Lock()
	defer s.statsMu.Unlock()
	if st := s.stats[method]; st != nil {
		return st.calls
	}
	return 0
}

// Fail makes every call of method (named as for [Server.Calls]) fail with
// Unavailable, without effect, until Fail(method, false): an outage of one
// operation, such as the moment between two steps of a client. A failed
// call is counted. A method the server does not serve panics, so that a
// misspelled name cannot leave a test's outage silently undone.
func (s *Server) Fail(method string, fail bool) {
	service, name, _ := strings.Cut(method, "/")
	info, ok := s.grpc.GetServiceInfo()["qdrant."+service]
	if !ok || !slices.ContainsFunc(info.Methods, func(m grpc.MethodInfo) bool { return m.Name == name }) {
		panic("qdranttest: Fail: no method " + method)
	}
	s.statsMu.Lock()
	defer s.statsMu.Unlock()
	s.failing[method] = fail
}

// MaxInFlight is the largest number of calls of a method that were being
// served at once.
func (s *Server) MaxInFlight(method string) int {
	s.statsMu.Lock()
	defer s.statsMu.Unlock()
	if st := s.stats[method]; st != nil {
		return st.maxInFlight
	}
	return 0
}

// resolve finds a collection by name or alias; s.mu must be held.
func (s *Server) resolve(name string) (*collection, error) {
	if c, ok := s.collections[name]; ok {
		return c, nil
	}
	if target, ok := s.aliases[name]; ok {
		if c, ok := s.collections[target]; ok {
			return c, nil
		}
	}
	return nil, notFound("Collection `%s` doesn't exist!", name)
}

// locked takes s.mu (for writing with write) and resolves the collection
// name; the caller calls unlock once done with it.
func (s *Server) locked(name string, write bool) (c *collection, unlock func(), err error) {
	lock, unlock := s.mu.RLock, s.mu.RUnlock
	if write {
		lock, unlock = s.mu.Lock, s.mu.Unlock
	}
	lock()
	if c, err = s.resolve(name); err != nil {
		unlock()
		return nil, nil, err
	}
	return c, unlock, nil
}

// nextOperation numbers an update; s.mu must be held for writing.
func (s *Server) nextOperation() *uint64 {
	s.operationID++
	id := s.operationID
	return &id
}

// applied answers an update. The server applies every update before it
// answers; like Qdrant it reports Completed only to a caller that waited.
func applied(op *uint64, wait bool, start time.Time) *qdrant.PointsOperationResponse {
	st := qdrant.UpdateStatus_Acknowledged
	if wait {
		st = qdrant.UpdateStatus_Completed
	}
	return &qdrant.PointsOperationResponse{
		Result: &qdrant.UpdateResult{OperationId: op, Status: st},
		Time:   since(start),
	}
}

func since(start time.Time) float64 { return time.Since(start).Seconds() }

// Qdrant's status messages carry the error class as a prefix.

func notFound(format string, args ...any) error {
	return status.Errorf(codes.NotFound, "Not found: "+format, args...)
}

// alreadyExists is StorageError::AlreadyExists, whose message Qdrant
// prints with the same "Wrong input" prefix as BadInput
// (lib/storage/src/content_manager/errors.rs).
func alreadyExists(format string, args ...any) error {
	return status.Errorf(codes.AlreadyExists, "Wrong input: "+format, args...)
}

func badInput(format string, args ...any) error {
	return status.Errorf(codes.InvalidArgument, "Wrong input: "+format, args...)
}

// zeroLimit is Qdrant's refusal of a page or result size of 0.
func zeroLimit() error {
	return status.Error(codes.InvalidArgument, "Validation error in body: [limit: value 0 invalid, must be 1 or larger]")
}

// unsupported rejects a request the server does not model.
func unsupported(what string) error {
	return status.Errorf(codes.InvalidArgument, "qdranttest: %s is not supported by the test server", what)
}
