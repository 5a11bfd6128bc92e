package schema

// NewMigrate exposes the migrations runner to the tests, which step down.
var NewMigrate = newMigrate
