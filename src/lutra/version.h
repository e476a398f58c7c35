/* lutra/version.h: the version this header belongs to.
 * Part of lutra.h (include that one; its conventions hold here).
 *
 * lutra_version (lutra/base.h) returns the version of the library actually loaded; a host can
 * compare it with these to catch a header/library mismatch. The Makefile reads them from here for
 * the installed library's names (liblutra.so.MAJOR.MINOR.PATCH, SONAME liblutra.so.MAJOR) and
 * lutra.pc, and the Lua front for the SONAME it looks for. */
#ifndef LUTRA_VERSION_H
#define LUTRA_VERSION_H

enum { LUTRA_VERSION_MAJOR = 0, LUTRA_VERSION_MINOR = 2, LUTRA_VERSION_PATCH = 0 };

#endif
