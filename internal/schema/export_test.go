package schema

// NewMigrate exposes the migrations runner to the tests, which step down.
var NewMigrate = newMigrate

// CreateSlotSQL exposes the slot statement chosen per server version.
var CreateSlotSQL = createSlotSQL

// Applied exposes the checks of whether each migration was applied.
var Applied = applied
