//go:build !linux

package redisdb

import "syscall"

// dieWithParent is nothing here: only Linux kills a child with its parent.
func dieWithParent() *syscall.SysProcAttr { return nil }
