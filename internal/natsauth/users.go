package natsauth

import (
	"maps"
	"slices"

	"github.com/nats-io/nats-server/v2/server"
)

// Permissions are the permission sets of every user, by user name, with
// the default names of the projectors (index, graph) and of the notifier
// and its bucket.
func Permissions() map[string]*server.Permissions {
	return map[string]*server.Permissions{
		UserRelay:    Relay(),
		UserWriter:   Writer(),
		UserIndex:    Projector("index"),
		UserGraph:    Projector("graph"),
		UserNotifier: Notifier(NotifierName, NotifierBucket),
		UserProducer: Producer(),
		UserOperator: Operator(),
	}
}

// ProjectorUser is the user name of projector name: projector-<name>.
func ProjectorUser(name string) string { return projectorUser + name }

// InboxPrefix is the inbox prefix of user, _INBOX_<user>: the replies to
// its requests, its pull deliveries and the acknowledgements of its
// publishes come to subjects under it, and user alone may subscribe there
// (each permission set allows <prefix>.> and no other subscription). Its
// connections take it from [ClientConfig.Options], so that the two cannot
// disagree. Not under _INBOX.: a grant of _INBOX.> covers no user's
// replies.
func InboxPrefix(user string) string { return "_INBOX_" + user }

// Users are the users of [Permissions] that have a password in passwords
// (by user name), in name order: a user without a password is left out,
// never admitted without one.
func Users(passwords map[string]string) []*server.User {
	all := Permissions()
	var users []*server.User
	for _, name := range slices.Sorted(maps.Keys(all)) {
		pw := passwords[name]
		if pw == "" {
			continue
		}
		users = append(users, &server.User{Username: name, Password: pw, Permissions: all[name]})
	}
	return users
}
