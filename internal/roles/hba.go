package roles

import (
	"fmt"
	"net/netip"
	"regexp"
	"strings"
)

// AddressPlaceholder stands for an address [HBA] was not given; the
// administrator must replace it before the lines are used.
const AddressPlaceholder = "<address>"

// HBAOptions says where converge's roles connect from.
type HBAOptions struct {
	// Database is converge's database; default DefaultDatabase.
	Database string
	// RelayAddress is the relay's address (an IP address, for one host,
	// or a CIDR range); empty: AddressPlaceholder.
	RelayAddress string
	// OwnerAddress is where `converge migrate up` runs from (as
	// RelayAddress); empty: AddressPlaceholder.
	OwnerAddress string
}

// HBALine is one line of pg_hba.conf and why it is there.
type HBALine struct {
	Line string `json:"line"`
	Why  string `json:"why"`
}

// HBA is the pg_hba.conf lines that admit converge's roles to converge's
// database alone, the two REPLICATION roles (Relay, Owner) from their own
// addresses alone, over TLS with a SCRAM-SHA-256 password, and refuse
// every converge role every other database and physical replication. They
// go above every other line of the file: the first line that matches a
// connection decides.
//
// A logical replication connection (the relay's stream) matches the
// database's name, never the keyword replication, which matches physical
// replication connections alone; so the relay needs no replication line.
// What these lines cannot limit is in docs/security.md ("What REPLICATION
// grants"): the relay's own connections to its database may still take a
// base backup of the whole cluster and decode every table of the database.
func HBA(opts HBAOptions) ([]HBALine, error) {
	db := opts.Database
	if db == "" {
		db = DefaultDatabase
	}
	dbField, err := hbaName(db)
	if err != nil {
		return nil, err
	}
	relay, err := hbaAddress("relay", opts.RelayAddress)
	if err != nil {
		return nil, err
	}
	owner, err := hbaAddress("owner", opts.OwnerAddress)
	if err != nil {
		return nil, err
	}
	all := strings.Join(Names(), ",")
	line := func(fields ...string) string { return strings.Join(fields, " ") }
	return []HBALine{
		{line("hostssl", dbField, Relay, relay, "scram-sha-256"),
			"the relay, from its address alone: its queries and its logical replication stream (which matches the database's name, not the keyword replication)"},
		{line("hostssl", dbField, Owner, owner, "scram-sha-256"),
			"converge migrate up, from where it runs alone: the owner holds REPLICATION too"},
		{line("hostssl", dbField, Writer+","+Reader+","+Producer, "all", "scram-sha-256"),
			"the writer, the read-only commands and the producers, from any address: none holds REPLICATION"},
		{line("host", "all", all, "all", "reject"),
			"converge's roles from any other address, without TLS, or to any other database (a REPLICATION role could decode that database's changes)"},
		{line("host", "replication", all, "all", "reject"),
			"physical replication connections of converge's roles: converge makes none"},
		{line("local", "all", all, "reject"),
			"converge's roles over the server's Unix socket"},
		{line("local", "replication", all, "reject"),
			"physical replication of converge's roles over the Unix socket"},
	}, nil
}

// plainName is a pg_hba.conf name that needs no quotes.
var plainName = regexp.MustCompile(`^[A-Za-z0-9_]+$`)

// hbaKeywords are the database field's keywords: a database so named is
// quoted.
var hbaKeywords = map[string]bool{"all": true, "sameuser": true, "samerole": true, "samegroup": true, "replication": true}

// hbaName is name as pg_hba.conf's database field matches it.
func hbaName(name string) (string, error) {
	if plainName.MatchString(name) && !hbaKeywords[strings.ToLower(name)] {
		return name, nil
	}
	if strings.ContainsAny(name, "\"\n\r") {
		return "", fmt.Errorf("roles: database name %q cannot be written in pg_hba.conf (a double quote or a line break)", name)
	}
	return `"` + name + `"`, nil
}

// hbaAddress is addr as pg_hba.conf's address field: an IP address as the
// range of that address alone, a CIDR range as given (normalised),
// nothing as AddressPlaceholder.
func hbaAddress(who, addr string) (string, error) {
	if addr == "" {
		return AddressPlaceholder, nil
	}
	if p, err := netip.ParsePrefix(addr); err == nil {
		return p.Masked().String(), nil
	}
	a, err := netip.ParseAddr(addr)
	if err != nil || a.Zone() != "" {
		return "", fmt.Errorf("roles: the %s's address %q is not an IP address nor a CIDR range (e.g. 10.0.0.5 or 10.0.0.0/24)", who, addr)
	}
	a = a.Unmap()
	return netip.PrefixFrom(a, a.BitLen()).String(), nil
}
