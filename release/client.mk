# The check service's client targets (issue 33), shared by the repository's Makefile and the
# student kit's (scripts/release.py ships this file beside the kit's Makefile). Needs PY,
# PYTHON_BASE and SUBMISSION defined before it is included.
# Issue 33: the course check service, for students without a GPU (grader/cli/client.py).
#   make submit SERVER=https://... TOKEN=... [KIND=check] [SUBMISSION=student]
#   make status SERVER=https://... [ID=...] [WAIT=1]   (ID: default, the latest one submitted)
# The token: TOKEN=..., TOKEN_FILE=path, or GRADER_TOKEN in the environment (a token on make's
# command line shows in `ps`; the client gets it through its environment); SERVER may be
# GRADER_SERVER in the environment. KIND=check runs the
# public cases, not ranked; the default, a submission, runs every case and is ranked. No set-up:
# the client is the standard library's, run by .venv's Python if there is one, else PYTHON_BASE.
KIND ?= submission
CLIENT_PY = $(if $(wildcard $(PY)),$(PY),$(PYTHON_BASE))
CLIENT_NEEDS = test -n "$$SERVER$$GRADER_SERVER" || { echo "make $@: give the service's address: \
  make $@ SERVER=https://... TOKEN=... (your instructor sends both)" >&2; exit 2; }; \
  test -n "$$TOKEN$$TOKEN_FILE$$GRADER_TOKEN" || { echo "make $@: give your token: TOKEN=..., \
  TOKEN_FILE=path, or GRADER_TOKEN in the environment" >&2; exit 2; }
CLIENT_ARGS = --server "$${SERVER:-$$GRADER_SERVER}" $(if $(TOKEN_FILE),--token-file "$$TOKEN_FILE")
CLIENT_ENV = GRADER_TOKEN="$${TOKEN:-$$GRADER_TOKEN}"
submit:
	@$(CLIENT_NEEDS)
	@case '$(KIND)' in check|submission) ;; *) echo "make submit: KIND=$(KIND): give KIND=check \
	(the public cases, not ranked) or KIND=submission (every case, ranked; the default)" >&2; \
	exit 2;; esac
	$(CLIENT_ENV) $(CLIENT_PY) -m grader submit $(CLIENT_ARGS) $(if $(filter check,$(KIND)),--check) \
	  $(SUBMISSION)

status:
	@$(CLIENT_NEEDS)
	$(CLIENT_ENV) $(CLIENT_PY) -m grader status $(CLIENT_ARGS) $(if $(filter 1,$(WAIT)),--wait) \
	  $(if $(ID),-- "$$ID")
