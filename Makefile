# lutra: liblutra.so (C11 core + CPU backend) and the LuaJIT front's generated cdef.
# Honours PREFIX, LIBDIR (where liblutra.so goes; luarocks passes its C module dir), LUADIR
# (where lua/lutra/*.lua goes), CFLAGS and LDFLAGS, as luarocks' "make" build type expects.

PREFIX  ?= /usr/local
LIBDIR  ?= $(PREFIX)/lib/lua/5.1
LUADIR  ?= $(PREFIX)/share/lua/5.1
CC      ?= cc
CFLAGS  ?= -O2 -g
LDFLAGS ?=
LUAJIT  ?= luajit
BUSTED  ?= $(LUAJIT) /usr/bin/busted
BLAS_CFLAGS ?= $(shell pkg-config --cflags openblas 2>/dev/null)
BLAS_LIBS   ?= -lopenblas

LUTRA_CFLAGS = -std=c11 -Wall -Wextra -Werror -fPIC -fvisibility=hidden -D_GNU_SOURCE \
               -Isrc $(BLAS_CFLAGS)
SRC  = $(sort $(wildcard src/*.c src/cpu/*.c))
OBJ  = $(SRC:%.c=build/%.o)
LIB  = liblutra.so
CDEF = lua/lutra/cdef.lua
LUA_FILES = $(filter-out $(CDEF),$(sort $(wildcard lua/lutra/*.lua)))
RUN_ENV = LUA_PATH="lua/?.lua;lua/?/init.lua;;" LUAJIT="$(LUAJIT)"

.PHONY: all test run bench install clean format

all: $(LIB) $(CDEF)

$(LIB): $(OBJ)
	$(CC) -shared -o $@ $(OBJ) $(LDFLAGS) $(BLAS_LIBS) -lm -lpthread

build/%.o: %.c $(wildcard src/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(LUTRA_CFLAGS) $(CFLAGS) -c -o $@ $<

# LuaJIT's cdef is the public header run through the preprocessor with LUTRA_CDEF defined.
$(CDEF): src/lutra.h tools/gen_cdef.sh
	sh tools/gen_cdef.sh "$(CC)" src/lutra.h > $@.tmp && mv $@.tmp $@

test: all
	$(RUN_ENV) $(BUSTED) --lpath="lua/?.lua;lua/?/init.lua" spec

run: all
	$(RUN_ENV) $(LUAJIT) examples/train_mlp.lua $(ARGS)

bench: all
	$(RUN_ENV) $(LUAJIT) bench/overhead.lua $(ARGS)

install: all
	install -d $(DESTDIR)$(LIBDIR) $(DESTDIR)$(LUADIR)/lutra
	install -m 755 $(LIB) $(DESTDIR)$(LIBDIR)/$(LIB)
	install -m 644 $(LUA_FILES) $(CDEF) $(DESTDIR)$(LUADIR)/lutra/

format:
	clang-format -i src/*.c src/*.h src/cpu/*.c

clean:
	rm -rf build $(LIB) $(CDEF) $(CDEF).tmp
