package roles

// The roles' names.
const (
	Owner  = "converge_owner"
	Writer = "converge_writer"
	Relay  = "converge_relay"
	Reader = "converge_reader"
	// Producer hands documents over in its own transactions (the
	// converge_inbox table); a team grants it to its application's role,
	// or connects as it.
	Producer = "converge_producer"
)

// Publication is the publication the relay streams (migration 1 creates it,
// FOR TABLE outbox); its owner is Owner.
const Publication = "converge_outbox"

// Schema is the schema the migrations create their objects in.
const Schema = "public"

// Role is one role of the definition: what it may do, and nothing more.
type Role struct {
	Name string
	// Job says what the role is for, in one line.
	Job string
	// Replication: the REPLICATION attribute (replication connections,
	// creating and reading replication slots).
	Replication bool
	// OnDatabase and OnSchema are its privileges on the database and on
	// Schema ("CONNECT", "CONNECT, CREATE", "USAGE", ...).
	OnDatabase, OnSchema string
	// Grants are its privileges on the schema's tables and sequences.
	Grants []TableGrant
	// Owns: it owns the schema's objects and the publication (it runs
	// the migrations).
	Owns bool
}

// TableGrant is privileges on some tables or sequences of Schema.
type TableGrant struct {
	Privileges string   // as in GRANT: "SELECT, INSERT"
	Sequence   bool     // the objects are sequences, not tables
	Objects    []string // unqualified names
}

// Tables are the tables the migrations create (schema_migrations is
// golang-migrate's), and Sequences their sequences. A migration that adds
// one adds it here and grants it below; the roles tests check both against
// the catalog of a migrated database.
var (
	Tables = []string{"documents", "chunks", "outbox", "schema_migrations", "converge_inbox", "converge_mapped_rows"}
	// converge_inbox_id_seq is its identity column's, which an insert
	// uses without any privilege on it: nobody is granted it.
	Sequences = []string{"outbox_emission_seq", "converge_inbox_id_seq"}
)

// Definition is every role, in the order Apply creates them.
var Definition = []Role{
	{
		Name: Owner, Job: "owns the schema: `converge migrate up` (which also creates the relay's slot)",
		Replication: true, OnDatabase: "CONNECT, CREATE", OnSchema: "USAGE, CREATE", Owns: true,
	},
	{
		Name: Writer, Job: "the writer: the only DML on the tables",
		OnDatabase: "CONNECT", OnSchema: "USAGE",
		Grants: []TableGrant{
			// SELECT because upserts (ON CONFLICT ... WHERE) and deletes
			// read the rows they change.
			{Privileges: "SELECT, INSERT, UPDATE, DELETE", Objects: []string{"documents", "chunks", "outbox"}},
			// It takes what producers handed over, marks what it refuses
			// and deletes what it applied.
			{Privileges: "SELECT, UPDATE, DELETE", Objects: []string{"converge_inbox"}},
			// It keeps which document each row of a mapped table gave.
			{Privileges: "SELECT, INSERT, UPDATE, DELETE", Objects: []string{"converge_mapped_rows"}},
			// Re-emissions number their outbox rows from it (nextval).
			{Privileges: "USAGE", Sequence: true, Objects: []string{"outbox_emission_seq"}},
			// Its readiness check reads the schema version.
			{Privileges: "SELECT", Objects: []string{"schema_migrations"}},
		},
	},
	{
		Name: Relay, Job: "the relay: streams the converge_outbox publication from its slot",
		Replication: true, OnDatabase: "CONNECT", OnSchema: "USAGE",
		Grants: []TableGrant{
			// It counts the outbox's rows when it creates the slot itself.
			{Privileges: "SELECT", Objects: []string{"outbox"}},
		},
	},
	{
		Name: Reader, Job: "read-only: `converge verify`, `converge status`, `converge migrate status`",
		OnDatabase: "CONNECT", OnSchema: "USAGE",
		Grants: []TableGrant{
			{Privileges: "SELECT", Objects: []string{"documents", "chunks", "outbox", "schema_migrations", "converge_inbox", "converge_mapped_rows"}},
		},
	},
	{
		Name: Producer, Job: "a producer: hands documents over in its own transactions (INSERT INTO converge_inbox) and reads what it handed over",
		OnDatabase: "CONNECT", OnSchema: "USAGE",
		Grants: []TableGrant{
			// SELECT to find its refused rows; the identity column needs
			// no privilege on its sequence.
			{Privileges: "SELECT, INSERT", Objects: []string{"converge_inbox"}},
		},
	},
}

// Names are the roles' names, in Definition's order.
func Names() []string {
	out := make([]string, len(Definition))
	for i, r := range Definition {
		out[i] = r.Name
	}
	return out
}
