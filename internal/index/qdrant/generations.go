package qdrant

import (
	"context"

	qd "github.com/qdrant/go-client/qdrant"
)

// AliasTarget returns the collection that alias names, or "" when no alias
// of that name exists.
func (b *Backend) AliasTarget(ctx context.Context, alias string) (string, error) {
	var aliases []*qd.AliasDescription
	err := b.call(ctx, func(ctx context.Context) error {
		resp, err := b.client.GetCollectionsClient().ListAliases(ctx, &qd.ListAliasesRequest{})
		aliases = resp.GetAliases()
		return err
	})
	if err != nil {
		return "", &Error{Op: "list aliases", Collection: alias, Err: err}
	}
	for _, a := range aliases {
		if a.GetAliasName() == alias {
			return a.GetCollectionName(), nil
		}
	}
	return "", nil
}

// CollectionExists reports whether a collection (not an alias) of that
// name exists. Qdrant's own CollectionExists is true for an alias too (it
// resolves the name as every collection-scoped call does), so an alias
// name is told apart by the list of aliases first.
func (b *Backend) CollectionExists(ctx context.Context, collection string) (bool, error) {
	target, err := b.AliasTarget(ctx, collection)
	if err != nil {
		return false, err
	}
	if target != "" {
		return false, nil
	}
	return b.nameExists(ctx, collection)
}

// nameExists asks Qdrant whether a collection or an alias of that name
// exists.
func (b *Backend) nameExists(ctx context.Context, collection string) (bool, error) {
	var exists bool
	err := b.call(ctx, func(ctx context.Context) error {
		resp, err := b.client.GetCollectionsClient().CollectionExists(ctx, &qd.CollectionExistsRequest{CollectionName: collection})
		exists = resp.GetResult().GetExists()
		return err
	})
	if err != nil {
		return false, &Error{Op: "collection exists", Collection: collection, Err: err}
	}
	return exists, nil
}
