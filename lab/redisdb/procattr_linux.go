//go:build linux

package redisdb

import "syscall"

// dieWithParent has the kernel kill a server whose parent died without
// stopping it.
func dieWithParent() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
