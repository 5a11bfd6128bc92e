package deadletter

// Exported for the tests of package deadletter_test.
var (
	RedriveMsg   = redriveMsg
	RedriveMsgID = redriveMsgID
)
