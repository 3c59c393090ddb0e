from chatfleet_picker.server import main

main()
