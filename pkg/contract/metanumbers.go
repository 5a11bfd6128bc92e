package contract

import (
	"strconv"
)

// Postgres numeric's limits: digits before and after the decimal point.
// jsonb stores meta numbers as numeric, so a number beyond them would be
// accepted here and refused by the database.
const (
	pgNumericIntDigits  = 131072
	pgNumericFracDigits = 16383
)

// checkMetaNumbers refuses canonical meta holding a number that is valid
// JSON but that Postgres cannot store (such as 1e200000), so it is named as
// bad input instead of failing a write.
func checkMetaNumbers(b []byte) error {
	inString := false
	for i := 0; i < len(b); i++ {
		c := b[i]
		if inString {
			switch c {
			case '\\':
				i++
			case '"':
				inString = false
			}
			continue
		}
		switch {
		case c == '"':
			inString = true
		case c == '-' || (c >= '0' && c <= '9'):
			j := i
			for j < len(b) && isNumberByte(b[j]) {
				j++
			}
			if !storableNumber(b[i:j]) {
				return invalid(CodeInvalidMeta, "meta", "number %s is outside what Postgres can store", truncate(string(b[i:j]), 40))
			}
			i = j - 1
		}
	}
	return nil
}

func isNumberByte(c byte) bool {
	return (c >= '0' && c <= '9') || c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E'
}

// storableNumber reports whether a JSON number fits Postgres numeric.
func storableNumber(num []byte) bool {
	intDigits, fracDigits, exp := 0, 0, 0
	i := 0
	if i < len(num) && num[i] == '-' {
		i++
	}
	for ; i < len(num) && num[i] >= '0' && num[i] <= '9'; i++ {
		intDigits++
	}
	if i < len(num) && num[i] == '.' {
		for i++; i < len(num) && num[i] >= '0' && num[i] <= '9'; i++ {
			fracDigits++
		}
	}
	if i < len(num) && (num[i] == 'e' || num[i] == 'E') {
		e, err := strconv.Atoi(string(num[i+1:]))
		if err != nil || e > pgNumericIntDigits || e < -pgNumericFracDigits-fracDigits-intDigits {
			return false
		}
		exp = e
	}
	return intDigits+exp <= pgNumericIntDigits && fracDigits-exp <= pgNumericFracDigits
}
