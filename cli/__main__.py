"""``python -m roicore.cli parity|bench ...``"""
from . import main

raise SystemExit(main())
